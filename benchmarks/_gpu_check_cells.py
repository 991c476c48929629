"""The cells and scripts gpu_check.py runs on a GPU engine: each one trains for real and ends by
binding ``figure`` (a dict), which the check brings back with ``--return figure``.  The framework
scripts also run as they are under ``torchrun --nproc_per_node 1`` and print ``figure`` as JSON.
"""

from __future__ import annotations

# The engine's view under the device rule: its GPUs, its own, what "cuda" means there.
DEVICE_RULE = """
import os, torch
figure = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
          "PHALANX_GPU": os.environ.get("PHALANX_GPU"), "LOCAL_RANK": os.environ["LOCAL_RANK"],
          "current_device": torch.cuda.current_device(), "device": str(device),
          "cuda_means": str(torch.empty(1, device="cuda").device)}
"""

# Steps/s stamped at each optimizer step's end, the first WARMUP left out (as bench_frameworks).
_TIMING = """
import json, os, time, torch
STEPS, WARMUP, BATCH = 60, 5, 64
STAMPS, LOSSES, DTYPE = [], [], []
def rate_of(stamps):
    kept = stamps[WARMUP:]
    return (len(kept) - 1) / (kept[-1] - kept[0])
torch.manual_seed(0)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                        torch.nn.Linear(1024, 1024), torch.nn.GELU(),
                                        torch.nn.Linear(1024, 10))
    def forward(self, x, labels=None):
        logits = self.body(x)
        DTYPE[:] = [str(logits.dtype)]  # inside the framework's autocast, if any
        loss = torch.nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}
X = torch.randn(STEPS * BATCH, 256)
Y = (X[:, :10].argmax(1)).long()
"""

_REPORT = """
figure = {"steps_per_s": rate_of(STAMPS), "first_loss": LOSSES[0], "last_loss": LOSSES[-1],
          "peak_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1),
          "dtype_seen": DTYPE[0] if DTYPE else None, "device": str(DEVICE)}
if int(os.environ.get("RANK", "0")) == 0:
    print(json.dumps(figure), flush=True)
"""

HF_TRAINER_BF16 = _TIMING + """
import tempfile
from transformers import Trainer, TrainerCallback, TrainingArguments
class Data(torch.utils.data.Dataset):
    def __len__(self): return len(X)
    def __getitem__(self, i): return {"x": X[i], "labels": Y[i]}
class Stamp(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        STAMPS.append(time.perf_counter())
class Watched(Net):
    def forward(self, x, labels=None):
        out = super().forward(x, labels)
        LOSSES.append(float(out["loss"].detach()))
        return out
args = TrainingArguments(output_dir=tempfile.mkdtemp(), bf16=True, max_steps=STEPS,
                         per_device_train_batch_size=BATCH, learning_rate=1e-3, report_to=[],
                         logging_steps=10_000, save_strategy="no", remove_unused_columns=False,
                         ddp_backend="nccl", dataloader_num_workers=0, disable_tqdm=True)
trainer = Trainer(model=Watched(), args=args, train_dataset=Data(), callbacks=[Stamp()])
trainer.train()
DEVICE = args.device
""" + _REPORT

ACCELERATE_BF16 = _TIMING + """
from accelerate import Accelerator
accelerator = Accelerator(mixed_precision="bf16")
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = torch.utils.data.DataLoader(list(zip(X, Y)), batch_size=BATCH)
model, opt, loader = accelerator.prepare(model, opt, loader)
for xb, yb in loader:
    out = model(xb, yb)
    accelerator.backward(out["loss"])
    opt.step()
    opt.zero_grad()
    LOSSES.append(float(out["loss"].detach()))
    STAMPS.append(time.perf_counter())
DEVICE = accelerator.device
""" + _REPORT

LIGHTNING_BF16 = _TIMING + """
import lightning
class Module(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = Net()
    def training_step(self, batch, batch_idx):
        out = self.net(*batch)
        LOSSES.append(float(out["loss"].detach()))
        return out["loss"]
    def on_train_batch_end(self, outputs, batch, batch_idx):
        STAMPS.append(time.perf_counter())
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
trainer = lightning.Trainer(accelerator="gpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                            strategy="ddp", precision="bf16-mixed", max_steps=STEPS,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False)
trainer.fit(Module(), torch.utils.data.DataLoader(list(zip(X, Y)), batch_size=BATCH))
DEVICE = trainer.strategy.root_device
""" + _REPORT

# wrap(model, shard=True) in its settings, and torch's own fully_shard with CPU offload in a
# cell; the same 8-block MLP (about 34M parameters), AdamW, 20 steps, the run's peak memory and
# what the earlier runs left allocated when it began (each run's peak counted it).
SHARDED_SETUP = """
import time, torch
torch.manual_seed(0)
def blocks():
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.GELU())
                                 for _ in range(8)], torch.nn.Linear(2048, 10))
"""

SHARDED = """
from phalanx import wrap
start_mb = round(torch.cuda.memory_allocated() / 2**20, 1)  # what earlier runs left on the GPU
torch.cuda.reset_peak_memory_stats()
model = {build}
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
xb = torch.randn(256, 2048, device=device)
yb = torch.randint(0, 10, (256,), device=device)
losses = []
for step in range(20):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
    losses.append(float(loss))
torch.cuda.synchronize()
figure = {{"first_loss": losses[0], "last_loss": losses[-1], "start_mb": start_mb,
          "peak_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1)}}
"""

SHARDED_BUILDS = {
    "wrap(shard=True)": "wrap(blocks().to(device), shard=True)",
    "wrap(shard=True, mp_policy=bf16)": "wrap(blocks().to(device), shard=True, mp_policy=torch.bfloat16)",
    "wrap(shard=True, offload=True)": "wrap(blocks(), shard=True, offload=True)",
    "fully_shard + CPUOffloadPolicy": "_fully_sharded_offloaded(blocks())",
}

FULLY_SHARD_OFFLOAD = """
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
def _fully_sharded_offloaded(model):
    for block in model:
        fully_shard(block, offload_policy=CPUOffloadPolicy())
    return fully_shard(model, offload_policy=CPUOffloadPolicy())
"""

# The quickstart notebook's cells on the GPU engines: one engine per GPU (its `-n 2` would ask
# for two GPUs), no scaling to three.
QUICKSTART_REPLACE = {"%cluster start -n 2": "%cluster start", "%cluster scale 3": ""}

# A one-step cell: its warm re-run against a bare ipyparallel round trip to the same engines.
ONE_STEP_SETUP = """
import torch
torch.manual_seed(0)
net = torch.nn.Linear(16, 1)
xs, ys = torch.randn(32, 16), torch.randn(32, 1)
"""

ONE_STEP = """%%distributed_fit --return net
opt = torch.optim.SGD(net.parameters(), lr=0.01)
opt.zero_grad()
torch.nn.functional.mse_loss(net(xs), ys).backward()
opt.step()
"""
