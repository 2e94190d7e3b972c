"""The ground floor: the adapter protocol, the registries, seeds, constants, fault hooks and the pure
diagnostics every other room may import. Imports nothing else of mmrl."""
