"""NPU701/NPU702 on the real transformers modeling files, end to end.

The six decoder models are migrated into a copy of the installed transformers package (symlinks for
everything else), and tiny random models are built from the original and the migrated package in
subprocesses with the same seed. Off an NPU the logits must be bit-identical. Then the fused branches
are forced on (`_is_npu` true) with CPU reference kernels in place of `torch_npu`: the logits must
still match, the kernels must be called as often as the model has norms and MLPs, and Gemma's GELU MLP
must keep its original code.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from npu_migrate.pipeline import migrate_text

MODELS = ("llama", "qwen2", "qwen3", "mistral", "gemma", "phi3")
LAYERS = 2
#: Sites per modeling file: one RMSNorm class and one MLP class each.
EXPECTED_SITES = {name: {"NPU701": 1, "NPU702": 1} for name in MODELS}
#: Kernel calls per forward pass: two norms per layer and the final norm (Qwen3 adds q/k norms);
#: one SwiGLU per layer, none for Gemma, whose MLP is GELU (`_is_silu` declines it at run time).
EXPECTED_CALLS = {
    name: {"npu_rms_norm": 2 * LAYERS + 1 + (2 * LAYERS if name == "qwen3" else 0),
           "npu_swiglu": 0 if name == "gemma" else LAYERS}
    for name in MODELS
}

RUNNER = textwrap.dedent('''
    import importlib, json, sys, types
    import torch
    import torch.nn.functional as F

    force = sys.argv[1] == "force"
    import transformers
    calls = {"npu_rms_norm": 0, "npu_swiglu": 0}

    def npu_rms_norm(x, gamma, epsilon=1e-6):
        # The kernel's constraints (torch_npu_facts 1.1): a guard that lets a violation through fails here.
        assert gamma.dtype == x.dtype and gamma.shape == x.shape[-1:] and x.dim() >= 2
        calls["npu_rms_norm"] += 1
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + epsilon)
        return (x.float() * rstd * gamma.float()).to(x.dtype), rstd

    def npu_swiglu(x, dim=-1):
        calls["npu_swiglu"] += 1
        a, b = x.chunk(2, dim)
        return (F.silu(a.float()) * b.float()).to(x.dtype)

    fake = types.SimpleNamespace(npu_rms_norm=npu_rms_norm, npu_swiglu=npu_swiglu)
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=%(layers)d, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=128, pad_token_id=0)
    out = {"transformers": transformers.__file__, "models": {}}
    for name, prefix in %(models)r:
        module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        if force:
            module._is_npu = lambda x: True
            module.torch_npu = fake
        config = getattr(transformers, prefix + "Config")(**common)
        config._attn_implementation = "eager"
        torch.manual_seed(0)
        model = getattr(module, prefix + "ForCausalLM")(config).eval()
        ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))
        before = dict(calls)
        with torch.no_grad():
            logits = model(ids).logits
        out["models"][name] = {
            "logits": logits.flatten().tolist(),
            "calls": {k: calls[k] - before[k] for k in calls},
            "fused_defined": hasattr(module, "_is_npu"),
        }
    print(json.dumps(out))
''') % {"layers": LAYERS, "models": [(m, p) for m, p in (("llama", "Llama"), ("qwen2", "Qwen2"), ("qwen3", "Qwen3"),
                                                         ("mistral", "Mistral"), ("gemma", "Gemma"), ("phi3", "Phi3"))]}


def _package_root() -> Path:
    return Path(importlib.util.find_spec("transformers").submodule_search_locations[0])


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    """A transformers package whose six modeling files are migrated, and the findings per model."""
    root = tmp_path_factory.mktemp("site")
    original = _package_root()
    package = root / "transformers"
    package.mkdir()
    for entry in original.iterdir():
        if entry.name not in ("models", "__pycache__"):
            (package / entry.name).symlink_to(entry)
    (package / "models").mkdir()
    for entry in (original / "models").iterdir():
        if entry.name not in MODELS and entry.name != "__pycache__":
            (package / "models" / entry.name).symlink_to(entry)
    findings = {}
    for name in MODELS:
        folder = package / "models" / name
        folder.mkdir()
        for entry in (original / "models" / name).iterdir():
            if entry.suffix == ".py" and entry.name != f"modeling_{name}.py":
                (folder / entry.name).symlink_to(entry)
        source = (original / "models" / name / f"modeling_{name}.py").read_text(encoding="utf-8")
        text, found = migrate_text(source, path=f"modeling_{name}.py")
        (folder / f"modeling_{name}.py").write_text(text, encoding="utf-8")
        findings[name] = (source, text, found)
    return root, findings


def _run(site: Path | None, mode: str) -> dict:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    path = [str(site)] if site else []
    code = f"import sys; sys.path[:0] = {path!r}; exec(sys.stdin.read())"
    done = subprocess.run(
        [sys.executable, "-c", code, mode], input=RUNNER, capture_output=True, text=True, env=env, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(migrated):
    site, _ = migrated
    return _run(None, "plain"), _run(site, "plain"), _run(site, "force")


@pytest.mark.parametrize("name", MODELS)
def test_expected_sites_get_a_fused_branch(migrated, name):
    _, findings = migrated
    source, text, found = findings[name]
    applied = {}
    for f in found:
        if f.fixed and "helpers" not in f.message:
            applied[f.rule_id] = applied.get(f.rule_id, 0) + 1
    assert applied == EXPECTED_SITES[name]
    assert text.count("torch_npu.npu_rms_norm(") == 1 and text.count("torch_npu.npu_swiglu(") == 1
    assert text.count("def _is_npu(") == 1 and text.count("def _is_silu(") == 1
    # The fused code reaches torch_npu only through the guarded import: no hard `import torch_npu`.
    assert "\nimport torch_npu\n" not in text
    # Every original line survives, in order: the branches and the prelude are insertions only.
    removed = [line for line in _diff(source, text) if line.startswith("-")]
    assert removed == []
    again, refound = migrate_text(text, path=f"modeling_{name}.py")
    assert again == text and not any(f.fixed for f in refound)


def _diff(a: str, b: str) -> list[str]:
    import difflib

    return [line for line in difflib.ndiff(a.splitlines(), b.splitlines()) if line[:1] in "+-"]


def test_migrated_package_is_the_one_imported(runs, migrated):
    original, plain, _ = runs
    site, _ = migrated
    assert original["transformers"].startswith(str(_package_root()))
    assert plain["transformers"].startswith(str(site))
    assert all(m["fused_defined"] for m in plain["models"].values())
    assert not any(m["fused_defined"] for m in original["models"].values())


@pytest.mark.parametrize("name", MODELS)
def test_off_npu_logits_are_bit_identical(runs, name):
    original, plain, _ = runs
    assert plain["models"][name]["logits"] == original["models"][name]["logits"]
    assert plain["models"][name]["calls"] == {"npu_rms_norm": 0, "npu_swiglu": 0}


@pytest.mark.parametrize("name", MODELS)
def test_forced_fused_branches_compute_the_same_model(runs, name):
    import torch

    original, _, forced = runs
    assert forced["models"][name]["calls"] == EXPECTED_CALLS[name]
    expected = torch.tensor(original["models"][name]["logits"])
    got = torch.tensor(forced["models"][name]["logits"])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
