"""Scenario python_metrics (expected label: cpu-bound).

Bottleneck: the data is ready in memory (one tensor, batches sliced in the loop,
no DataLoader) and the training step is a small MLP; after every step a
pure-Python per-sample bookkeeping loop (logits.tolist(), per-sample dicts,
softmax/entropy/top-k by hand, a running per-class confusion table and a
calibration histogram in dicts) costs several times the step itself, in the
main thread, outside any data pipeline.

--relieve: the same metrics computed vectorised in torch (softmax, entropy,
topk, bincount) once per step.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc

EXPECTED = "cpu-bound"
NAME = "python_metrics"
N_SAMPLES, BATCH, DIM, CLASSES = 8192, 128, 64, 50


def python_metrics(logits: torch.Tensor, y: torch.Tensor, table: dict, hist: dict) -> float:
    rows, labels = logits.tolist(), y.tolist()
    records = []
    for row, label in zip(rows, labels, strict=False):
        m = max(row)
        exps = [math.exp(v - m) for v in row]
        total = sum(exps)
        probs = [e / total for e in exps]
        entropy = -sum(p * math.log(p + 1e-12) for p in probs)
        ranked = sorted(range(len(probs)), key=lambda k: -probs[k])
        rec = {"label": label, "pred": ranked[0], "top5": label in ranked[:5], "conf": probs[ranked[0]], "ent": entropy}
        table[(label, rec["pred"])] += 1
        hist[min(9, int(rec["conf"] * 10))] += 1
        records.append(rec)
    return sum(r["top5"] for r in records) / len(records)


def torch_metrics(logits: torch.Tensor, y: torch.Tensor, table: torch.Tensor, hist: torch.Tensor) -> float:
    p = logits.softmax(1)
    _ = -(p * (p + 1e-12).log()).sum(1)
    conf, pred = p.max(1)
    table += torch.bincount(y * CLASSES + pred, minlength=CLASSES * CLASSES).view(CLASSES, CLASSES)
    hist += torch.bincount((conf * 10).long().clamp(max=9), minlength=10)
    return float((logits.topk(5, 1).indices == y[:, None]).any(1).float().mean())


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    x_all = torch.randn(N_SAMPLES, DIM)
    y_all = (x_all[:, :CLASSES].argmax(1)).long()
    model = nn.Sequential(nn.Linear(DIM, 128), nn.ReLU(), nn.Linear(128, CLASSES)).to(device)
    opt = sc.adam(model)
    table_py: dict = defaultdict(int)
    hist_py: dict = defaultdict(int)
    table_t = torch.zeros(CLASSES, CLASSES, dtype=torch.long)
    hist_t = torch.zeros(10, dtype=torch.long)

    def step(i: int) -> torch.Tensor:
        x, y = sc.batch_at(x_all, y_all, i, BATCH, device)
        logits = model(x)
        loss = sc.optimize(opt, F.cross_entropy(logits, y))
        with torch.no_grad():
            if args.relieve:
                torch_metrics(logits.detach(), y, table_t, hist_t)
            else:
                python_metrics(logits.detach(), y, table_py, hist_py)
        return loss

    return sc.Loop(itertools.count(), step)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)
