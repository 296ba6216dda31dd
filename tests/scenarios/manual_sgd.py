"""Scenario manual_sgd (expected label: cpu-bound): a training loop without ``torch.optim``.

The loop of pytorch/examples' word_language_model (``main.py``'s ``train()``): a 2-layer LSTM
language model (embedding and hidden size 200, a 10 000-word vocabulary, 35 tokens by 20
sequences a batch, here from synthetic token streams in memory) whose parameters are updated by
hand after ``loss.backward()``::

    model.zero_grad()
    hidden = repackage_hidden(hidden)
    output, hidden = model(data, hidden)
    loss = criterion(output, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)

No optimizer step ever runs, so step boundaries can only come from the backward passes. The
LSTM and the 200 x 10 000 decoder compute on the CPU in the training's own thread (one
intra-op thread).

--relieve: embedding and hidden size 50 instead of 200 (the decoder 4x, the LSTM ~16x cheaper).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc

EXPECTED = "cpu-bound"
NAME = "manual_sgd"
NTOKEN, BPTT, BATCH, CLIP, LR = 10_000, 35, 20, 0.25, 20.0


class RNNModel(nn.Module):
    """Encoder, LSTM, decoder: word_language_model's ``RNNModel`` for ``--model LSTM``."""

    def __init__(self, ninp: int, nhid: int, nlayers: int = 2, dropout: float = 0.2) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(NTOKEN, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, NTOKEN)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(
        self, x: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        emb = self.drop(self.encoder(x))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, NTOKEN)
        return nn.functional.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(self.nlayers, bsz, self.nhid), torch.zeros(self.nlayers, bsz, self.nhid)


def batches(stream: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``get_batch``: (data, targets) windows of ``BPTT`` tokens over the ``BATCH`` streams."""
    for i in range(0, stream.size(0) - 1 - BPTT, BPTT):
        yield stream[i : i + BPTT], stream[i + 1 : i + 1 + BPTT].reshape(-1)


class Epochs:
    """Epoch after epoch of :func:`batches` over ``stream``."""

    def __init__(self, stream: torch.Tensor) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return batches(self.stream)


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    # One intra-op thread: on a shared 2-core machine a second OpenMP thread that loses its core
    # stalls every op at its barrier, and the steps/s this scenario prints would swing 5x.
    torch.set_num_threads(1)
    size = 50 if args.relieve else 200
    model = RNNModel(size, size)
    criterion = nn.NLLLoss()
    stream = torch.randint(0, NTOKEN, (BPTT * 200 + 1, BATCH))
    hidden = model.init_hidden(BATCH)
    model.train()

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        nonlocal hidden
        data, targets = batch
        model.zero_grad()
        hidden = (hidden[0].detach(), hidden[1].detach())  # repackage_hidden
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        for p in model.parameters():
            assert p.grad is not None
            p.data.add_(p.grad, alpha=-LR)
        return loss.detach()

    return sc.Loop(Epochs(stream), step)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup, device="cpu")  # the CPU whatever --device says
