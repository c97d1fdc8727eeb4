"""Real mixture-of-experts code (#23): transformers' Mixtral experts loop over the experts a batch routes
to, with control flow around each expert's SwiGLU. NPU702 gives the split (`gate, up = linear(...).chunk(2,
-1)`) and the gating statement one branch in their place, passing the projection to npu_swiglu itself (no
copy). The migrated modeling file is imported in place of transformers' own, and a tiny random model runs
three ways: the original, the migrated one off an NPU (bit-identical), and the migrated one with the
branches forced through the CPU reference kernels (the same logits, one kernel call per expert routed to).
A deliberately broken branch (the halves swapped) is shown failing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_fused_transformers import _mirror, _package_root

from npu_migrate.engine.pipeline import helper_imports, migrate_text
from npu_migrate.output.helper_module import changes
from npu_migrate.program.packages import collect, helper_module

pytestmark = pytest.mark.integration  # needs torch and transformers: the `integration` extra

MODELING = "models/mixtral/modeling_mixtral.py"
#: The branch's projection, as the migrated file writes it, and a mutant with the halves swapped.
PROJECTION = "nn.functional.linear(current_state, self.gate_up_proj[expert_idx]), -1"
SWAPPED = "nn.functional.linear(current_state, self.gate_up_proj[expert_idx]).roll(96, -1), -1"

RUNNER = textwrap.dedent("""
    import importlib, json, sys
    import torch

    force = sys.argv[1] == "force"
    import transformers
    from npu_migrate.verify.reference import torch_npu_module

    fake = torch_npu_module()
    if force:
        helpers = importlib.import_module("transformers._npu_fused")
        helpers._is_npu = lambda x: True
        helpers.torch_npu = fake
    module = importlib.import_module("transformers.models.mixtral.modeling_mixtral")
    config = transformers.MixtralConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=128, num_local_experts=4, num_experts_per_tok=2, pad_token_id=0,
    )
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # the loop in the modeling file (the default is torch's grouped_mm)
    torch.manual_seed(0)
    model = module.MixtralForCausalLM(config).eval()
    with torch.no_grad():  # weights far from their init: a wrong rewrite shows in the logits
        for parameter in model.parameters():
            parameter.normal_(0, 1 / parameter.shape[-1] ** 0.5 if parameter.dim() > 1 else 0.5).add_(
                1 if parameter.dim() == 1 else 0
            )
    routed = []
    for experts in (m for m in model.modules() if type(m).__name__ == "MixtralExperts"):
        experts.register_forward_pre_hook(lambda m, args: routed.append(len(args[1].unique())))
    ids = torch.randint(1, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids).logits.flatten().tolist()
    print(json.dumps({"file": module.__file__, "logits": logits, "swiglu": fake.calls["npu_swiglu"],
                      "routed": sum(routed)}))
""")


def _migrated_package(root: Path, mutate: tuple[str, str] | None = None) -> str:
    """A transformers package under `root` whose Mixtral modeling file is migrated (with its helper
    module); the migrated file's text."""
    original = _package_root()
    package = root / "transformers"
    _mirror(original, package, {"models"})
    _mirror(original / "models", package / "models", {"mixtral"})
    _mirror(original / "models" / "mixtral", package / "models" / "mixtral", {"modeling_mixtral.py"})
    module = helper_module(package / MODELING)
    text, _ = migrate_text(
        (original / MODELING).read_text(encoding="utf-8"), path="modeling_mixtral.py", helper_module=module
    )
    imports: dict = {}
    collect(imports, package / MODELING, *helper_imports(text, None, module))
    (change,) = changes(imports)
    change.path.write_text(change.after, encoding="utf-8")
    if mutate is not None:
        assert mutate[0] in text, "the mutant no longer applies to the migrated file"
        text = text.replace(*mutate)
    (package / MODELING).write_text(text, encoding="utf-8")
    return text


def _run(site: Path | None, mode: str) -> dict:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    path = [str(site)] if site else []
    code = f"import sys; sys.path[:0] = {path!r}; exec(sys.stdin.read())"
    done = subprocess.run(
        [sys.executable, "-c", code, mode], input=RUNNER, capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    text = _migrated_package(site)
    return text, site, _run(None, "plain"), _run(site, "plain"), _run(site, "force")


def test_the_experts_split_and_gate_get_one_branch(runs):
    text, *_ = runs
    branch = text[text.index("if _is_npu(current_state)") :]
    assert branch.startswith("if _is_npu(current_state) and _is_silu(self.act_fn):")
    assert "_npu_swiglu_halves(" in branch.split("else:")[0] and PROJECTION in text
    # The original statements, under `else:`, as written.
    assert (
        "else:\n                gate, up = nn.functional.linear(current_state, self.gate_up_proj[expert_idx]).chunk(2, dim=-1)\n"
        in text
    )
    again, refound = migrate_text(text, path="modeling_mixtral.py", helper_module="..._npu_fused")
    assert again == text and not any(f.fixed for f in refound)


def test_off_an_npu_the_migrated_model_is_bit_identical(runs):
    _, site, original, plain, _ = runs
    assert plain["file"].startswith(str(site)) and not original["file"].startswith(str(site))
    assert plain["logits"] == original["logits"] and plain["swiglu"] == 0


def test_forced_branches_compute_the_same_model_once_per_routed_expert(runs):
    import torch

    *_, original, _, forced = runs
    assert forced["swiglu"] == forced["routed"] > 0
    torch.testing.assert_close(torch.tensor(forced["logits"]), torch.tensor(original["logits"]), rtol=1e-5, atol=1e-5)


def test_a_broken_branch_is_caught(runs, tmp_path):
    import torch

    *_, original, _, _ = runs
    _migrated_package(tmp_path, mutate=(PROJECTION, SWAPPED))
    broken = _run(tmp_path, "force")
    assert broken["swiglu"] == broken["routed"] > 0
    got, expected = torch.tensor(broken["logits"]), torch.tensor(original["logits"])
    assert not torch.allclose(got, expected, rtol=1e-3, atol=1e-3)
