"""Study (docs/RESULTS.md): rejection-sampling fine-tuning by hand, outside the trainer: 16 puzzles x 16 samples
at temperature 1, LLaDA SFT loss on the best sample of each puzzle (`best`) or only on fully solved ones
(`perfect`); prints held-out greedy accuracy every 10 steps.

    python scripts/studies/self_training_control.py BASE_DIR LR STEPS [best|perfect]
"""
import sys, os, torch, torch.nn.functional as F, random
torch.set_num_threads(1); torch.manual_seed(0)
from mmrl.models import adapter_class
from mmrl.data.tasks import load_task
from mmrl.evaluate import evaluate, d1_generation
task = load_task("sudoku4"); gen = d1_generation("masked_diffusion", 16, 16, 16)
pol = adapter_class("masked_diffusion").from_pretrained(sys.argv[1])
lr=float(sys.argv[2]); steps=int(sys.argv[3]); mode=sys.argv[4] if len(sys.argv)>4 else "best"
model=pol.model
opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
def cellacc(c, row):
    c = "".join(ch for ch in c if ch.isdigit())[:16]
    bl=[i for i,ch in enumerate(row["puzzle"]) if ch=="0"]
    return sum(1 for i in bl if i<len(c) and c[i]==row["solution"][i])/len(bl)
rnd=random.Random(0); G=16
for step in range(steps+1):
    if step%10==0:
        model.eval(); print(step, "eval", round(evaluate(pol, task.test[:256], task.metric, batch_size=128, progress=False, **gen).accuracy,3), flush=True); model.train()
    if step==steps: break
    rows=rnd.sample(task.train, 16)
    with torch.no_grad():
        ro=pol.sample([r["prompt"] for r in rows], G, seeds=[rnd.randrange(1<<30) for _ in range(16*G)], gen_length=16, block_length=16, steps=16, temperature=1.0)
    rew=torch.tensor([cellacc(c, rows[i//G]) for i,c in enumerate(ro.completions)]).view(16,G)
    best=rew.argmax(1)+torch.arange(16)*G
    if mode=="perfect":
        best=best[rew.max(1).values>=1.0]
        if len(best)==0: continue
    x_p=ro.prompt_ids[best]; m_p=ro.prompt_mask[best]; x_r=ro.response_ids[best]; fixed=ro.extras["fixed"][best]
    b,t_len=x_r.shape
    t=1e-3+(1-1e-3)*torch.rand(b,1)
    masked=(torch.rand(b,t_len)<t)&~fixed
    noisy=torch.where(masked, torch.full_like(x_r, pol.mask_token_id), x_r)
    logits=pol.backbone_logits(m_p,t_len,model)(torch.cat([x_p,noisy],1))[:, -t_len:]
    ce=F.cross_entropy(logits.reshape(-1,logits.shape[-1]).float(), x_r.reshape(-1), reduction="none").view(b,t_len)
    loss=((ce*masked)/t).sum()/(b*t_len-fixed.sum()).clamp(min=1)
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(),1.0); opt.step()
    if step%5==0: print(step, "reward mean", round(rew.mean().item(),3), "best", round(rew.max(1).values.mean().item(),3), "comp0", ro.completions[0], rows[0]["solution"], flush=True)
