"""A small single-node training script written for NVIDIA GPUs: the bundled migration example.

Run `npu-migrate apply --diff examples/tiny_cnn` to see what changes for Ascend NPUs.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from model import TinyConvNet


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a tiny CNN (uses cuda when available).")
    parser.add_argument("--device", default="cuda", help="device to train on, e.g. cuda or cuda:1")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--profile", action="store_true", help="report peak cuda memory")
    return parser.parse_args()


def synthetic_data(n: int = 512) -> TensorDataset:
    images = torch.randn(n, 3, 32, 32)
    labels = torch.randint(0, 10, (n,))
    return TensorDataset(images, labels)


def main() -> None:
    args = parse_args()
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    device = torch.device(args.device if torch.cuda.is_available() else "cpu")
    torch.cuda.manual_seed_all(0)

    model = TinyConvNet().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(synthetic_data(), batch_size=args.batch_size, shuffle=True, pin_memory=True)

    for epoch in range(args.epochs):
        start = time.time()
        for images, labels in loader:
            images = images.cuda(non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        torch.cuda.synchronize()
        print(f"epoch {epoch}: loss {loss.item():.3f} in {time.time() - start:.1f}s")

    if args.profile and images.is_cuda:
        print("peak memory", torch.cuda.max_memory_allocated() / 2**20, "MiB")
    if torch.cuda.get_device_capability()[0] >= 8:
        print("bf16 capable GPU")
    torch.save(model.state_dict(), "tiny.pt")
    state = torch.load("tiny.pt", map_location="cuda:0")
    model.load_state_dict(state)


if __name__ == "__main__":
    main()
