import sys, json, math, subprocess, torch
sys.path.insert(0, "/work/wt/mla/tools")
import reference as R
model, text = sys.argv[1], open(sys.argv[2]).read()
out = subprocess.run(["/work/wt/mla/build/kvsieve", "tokenize", "-m", model, "-p", text, "--json"], capture_output=True, text=True).stdout
ids = json.loads(out)
if isinstance(ids, dict): ids = ids.get("ids") or ids.get("tokens")
ids = [1] + [int(x) for x in ids]
m = R.Model(model, n_ctx=4096)
pc, nll, cnt = 128, 0.0, 0
for ch in range(8):
    b = ids[ch * pc:(ch + 1) * pc]; b[0] = 1
    lg = m.forward(b)
    lp = torch.log_softmax(lg, dim=-1)
    for j in range(pc // 2, pc - 1):
        nll -= float(lp[j, ids[ch * pc + j + 1]]); cnt += 1
    print(ch, math.exp(nll / cnt), flush=True)
print("reference PPL", math.exp(nll / cnt), cnt)
