"""Mode `model`: what the model is, what it computes, how it feeds the device, and how hard the move is.

* architecture: the `nn.Module` subclasses (through local base classes too), the layer inventory by kind
  (linear, convolution, attention, norms, activations, embeddings, recurrent) with counts and locations,
  the distributed setup (DDP, FSDP, DeepSpeed, DataParallel, the process-group backend) and AMP;
* computation: the heavy operators in cost order, whether each runs natively on Ascend, and the fusion
  opportunities (linear + activation, conv + batch norm + activation, and the four fused kernels:
  RMSNorm, SwiGLU, rotary embedding, flash attention);
* memory and input pipeline: DataLoader settings, host-device syncs inside loops, mixed precision,
  gradient checkpointing and accumulation;
* a complexity rating (Low / Medium / High) with the work items that produce it, and an effort estimate
  (the heuristic is `npu_migrate.analyze.effort`'s).
"""

from __future__ import annotations

import ast
from collections import Counter, defaultdict

from npu_migrate.analyze import effort
from npu_migrate.analyze import rules as R
from npu_migrate.analyze.modes.affinity_apis import fused_rule_targets, is_fused_site
from npu_migrate.analyze.modes.torch_apis import UNSUPPORTED
from npu_migrate.analyze.project import (
    Context,
    Mode,
    ModeResult,
    Project,
    Source,
    Table,
    Visitor,
    finding_key,
    location_key,
    walk,
)
from npu_migrate.program.api import cuda_package, package_table

_NN = "torch.nn."
_F = "torch.nn.functional."

LAYER_KINDS = {
    "linear": {"Linear", "Bilinear", "LazyLinear"},
    "convolution": {
        "Conv1d",
        "Conv2d",
        "Conv3d",
        "ConvTranspose1d",
        "ConvTranspose2d",
        "ConvTranspose3d",
        "LazyConv2d",
    },
    "attention": {"MultiheadAttention", "Transformer", "TransformerEncoderLayer", "TransformerDecoderLayer"},
    "normalization": {
        "LayerNorm",
        "BatchNorm1d",
        "BatchNorm2d",
        "BatchNorm3d",
        "GroupNorm",
        "RMSNorm",
        "InstanceNorm1d",
        "InstanceNorm2d",
        "InstanceNorm3d",
        "SyncBatchNorm",
        "LocalResponseNorm",
    },
    "activation": {
        "ReLU",
        "GELU",
        "SiLU",
        "Tanh",
        "Sigmoid",
        "LeakyReLU",
        "Softmax",
        "Mish",
        "Hardswish",
        "ELU",
        "PReLU",
        "Softplus",
        "ReLU6",
        "GLU",
        "LogSoftmax",
    },
    "embedding": {"Embedding", "EmbeddingBag"},
    "recurrent": {"LSTM", "GRU", "RNN", "LSTMCell", "GRUCell"},
    "pooling": {"MaxPool1d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "AdaptiveAvgPool1d", "MaxPool3d"},
    "dropout": {"Dropout", "Dropout1d", "Dropout2d"},
}
_KIND_OF = {name: kind for kind, names in LAYER_KINDS.items() for name in names}
#: Hand-written modules named after what they are (a Llama `LlamaRMSNorm` is a norm, not a generic module).
_CUSTOM_KINDS = (
    ("rmsnorm", "normalization"),
    ("layernorm", "normalization"),
    ("attention", "attention"),
    ("rotary", "positional"),
    ("rope", "positional"),
    ("swiglu", "mlp"),
    ("mlp", "mlp"),
    ("feedforward", "mlp"),
    ("embedding", "embedding"),
)

_ACTIVATION_FUNCS = {"relu", "gelu", "silu", "tanh", "sigmoid", "leaky_relu", "mish", "hardswish", "elu", "softplus"}

#: Heavy operators: (cost order, how it runs on Ascend). Order 1 costs most per call at typical sizes.
OPERATORS = {
    "attention": (
        1,
        "native: F.scaled_dot_product_attention and nn.MultiheadAttention run on NPU; "
        "torch_npu.npu_fusion_attention is the fused kernel",
    ),
    "convolution": (2, "native (aclnn convolution, Cube unit)"),
    "matmul": (3, "native (aclnn matmul, Cube unit)"),
    "linear": (3, "native (aclnn matmul, Cube unit)"),
    "recurrent": (3, "native (torch_npu LSTM/GRU kernels)"),
    "normalization": (4, "native; RMSNorm has the fused torch_npu.npu_rms_norm"),
    "softmax": (5, "native; masked softmax has torch_npu.npu_scaled_masked_softmax"),
    "embedding": (6, "native (aclnn embedding)"),
    "loss": (6, "native"),
    "activation": (7, "native (Vector unit); SwiGLU / GEGLU / QuickGELU have fused kernels"),
    "pooling": (7, "native"),
}
_FUNCTIONAL_KIND = {
    "torch.matmul": "matmul",
    "torch.bmm": "matmul",
    "torch.mm": "matmul",
    "torch.einsum": "matmul",
    "torch.baddbmm": "matmul",
    "torch.addmm": "matmul",
    _F + "linear": "linear",
    _F + "conv1d": "convolution",
    _F + "conv2d": "convolution",
    _F + "conv3d": "convolution",
    _F + "scaled_dot_product_attention": "attention",
    _F + "softmax": "softmax",
    "torch.softmax": "softmax",
    _F + "log_softmax": "softmax",
    _F + "layer_norm": "normalization",
    _F + "group_norm": "normalization",
    _F + "batch_norm": "normalization",
    "torch.rsqrt": "normalization",
    _F + "embedding": "embedding",
    _F + "cross_entropy": "loss",
    _F + "nll_loss": "loss",
    _F + "mse_loss": "loss",
    **{_F + name: "activation" for name in _ACTIVATION_FUNCS},
    "torch.sigmoid": "activation",
    "torch.tanh": "activation",
}
#: What a CUDA-only package's function computes, by its name (`flash_attn_varlen_func`, `xformers.ops.SwiGLU`).
_PACKAGE_OPERATOR_WORDS = (
    ("attention", ("attn", "attention", "mha", "fmha")),
    ("normalization", ("rms_norm", "rmsnorm", "layer_norm", "layernorm")),
    ("loss", ("cross_entropy", "crossentropy")),
    ("activation", ("swiglu", "gelu", "silu")),
)


def _package_operator(qualname: str) -> str | None:
    """The heavy-operator kind of a call into a CUDA-only package, or None for its helpers: the version
    (`flash_attn.__version__.split`), padding utilities, config classes."""
    if cuda_package(qualname, package_table()) is None:
        return None
    parts = qualname.split(".")
    if any(part.startswith("_") for part in parts[1:]):
        return None
    last = parts[-1].lower()
    return next((kind for kind, words in _PACKAGE_OPERATOR_WORDS if any(w in last for w in words)), None)


_SYNC_METHODS = {"item", "cpu", "numpy", "tolist"}
_SYNC_CALLS = {"torch.cuda.synchronize", "torch.npu.synchronize"}


def _kwarg(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _literal(node: ast.AST | None):
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return ast.unparse(node)


class _Scanner(Visitor):
    def __init__(self, source: Source) -> None:
        self.s = source
        self.classes: list[dict] = []
        self.layers: list[list] = []  # [kind, name, location]
        self.operators: list[list] = []  # [kind, api, location]
        self.distributed: list[list] = []  # [what, detail, location]
        self.amp: list[list] = []
        self.checkpointing: list[str] = []
        self.accumulation: list[str] = []
        self.loaders: list[dict] = []
        self.fusions: list[list] = []  # [pattern, detail, location]
        self.findings = []
        self._loops: list[ast.AST] = []
        self._class: list[str] = []
        self._assigned_in_loop: list[set[str] | None] = []  # per loop, computed on first print()
        self._gated: set[int] = set()  # calls that are a factor of a product: a gate (SwiGLU), not linear+act

    def where(self, node) -> str:
        return self.s.where(node)

    # -- classes
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        bases = []
        for base in node.bases:
            bases.append(self.s.names.resolve(base) or ast.unparse(base))
        self.classes.append({"name": node.name, "module": self.s.module, "bases": bases, "location": self.where(node)})
        self._class.append(node.name)
        self.generic_visit(node)
        self._class.pop()

    # -- loops and syncs
    def _loop(self, node) -> None:
        self._loops.append(node)
        self._assigned_in_loop.append(None)
        self.generic_visit(node)
        self._loops.pop()
        self._assigned_in_loop.pop()

    visit_For = visit_While = visit_AsyncFor = _loop

    def _loop_names(self) -> set[str]:
        if self._assigned_in_loop[-1] is None:
            self._assigned_in_loop[-1] = {
                t.id
                for n in walk(self._loops[-1])
                if isinstance(n, ast.Assign)
                for t in n.targets
                if isinstance(t, ast.Name)
            }
        return self._assigned_in_loop[-1]

    def _sync(self, node: ast.AST, what: str) -> None:
        loop = self._loops[-1]
        line, col = self.s.pos(node)
        self.findings.append(
            R.finding(
                R.HOST_SYNC,
                self.s.display,
                line,
                col,
                f"{what} synchronises the device in every iteration of the loop at line {loop.lineno}: "
                "log every N steps or keep the value on the device",
            )
        )

    def visit_Call(self, node: ast.Call) -> None:
        qualname = self.s.names.resolve(node.func)
        func = node.func
        if self._loops:
            if qualname is None and isinstance(func, ast.Attribute) and func.attr in _SYNC_METHODS and not node.args:
                self._sync(node, f"{self.s.segment(func.value, 40)}.{func.attr}()")
            elif qualname in _SYNC_CALLS:
                self._sync(node, f"{qualname}()")
            elif (
                isinstance(func, ast.Name)
                and func.id == "print"
                and any(isinstance(a, ast.Name) and a.id in self._loop_names() for a in node.args)
            ):
                self._sync(node, f"print({self.s.segment(node.args[0], 40)})")
        if qualname is not None:
            self._torch_call(node, qualname)
        elif isinstance(func, ast.Attribute) and func.attr in ("gradient_checkpointing_enable",):
            self.checkpointing.append(self.where(node))
        self._fusion(node, qualname)
        self.generic_visit(node)

    def _torch_call(self, node: ast.Call, qualname: str) -> None:
        where = self.where(node)
        if qualname.startswith(_NN) and qualname.count(".") == 2:
            name = qualname[len(_NN) :]
            kind = _KIND_OF.get(name)
            if kind is not None:
                self.layers.append([kind, f"nn.{name}", where])
                if kind in OPERATORS:
                    self.operators.append([kind, f"nn.{name}", where])
            elif name == "DataParallel":
                self.distributed.append(["DataParallel", "not supported on NPU (NPU305): use DDP", where])
            elif name == "Sequential":
                self._sequential(node)
        if qualname in _FUNCTIONAL_KIND:
            kind = _FUNCTIONAL_KIND[qualname]
            self.operators.append([kind, qualname.replace(_F, "F.").replace("torch.", "torch."), where])
        else:
            kind = _package_operator(qualname)
            if kind is not None:
                self.operators.append([kind, qualname, where])
                self.layers.append([kind, qualname, where])
        if qualname in (
            "torch.nn.parallel.DistributedDataParallel",
            "torch.nn.parallel.distributed.DistributedDataParallel",
        ):
            self.distributed.append(["DDP", "DistributedDataParallel", where])
        elif qualname.startswith("torch.distributed.fsdp.") and qualname.rsplit(".", 1)[-1] in (
            "FullyShardedDataParallel",
            "fully_shard",
        ):
            self.distributed.append(["FSDP", qualname.rsplit(".", 1)[-1], where])
        elif qualname == "torch.distributed.init_process_group":
            backend = _kwarg(node, "backend") or (node.args[0] if node.args else None)
            self.distributed.append(
                ["process group", f"backend={_literal(backend) if backend is not None else 'default'}", where]
            )
        elif qualname == "deepspeed.initialize":
            self.distributed.append(["DeepSpeed", "deepspeed.initialize", where])
        elif qualname in ("torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast"):
            dtype = _kwarg(node, "dtype")
            self.amp.append(
                ["autocast", f"{qualname}(dtype={ast.unparse(dtype) if dtype is not None else 'default'})", where]
            )
        elif qualname in ("torch.amp.GradScaler", "torch.cuda.amp.GradScaler"):
            self.amp.append(["GradScaler", qualname, where])
        elif qualname.startswith("torch.utils.checkpoint."):
            self.checkpointing.append(where)
        elif qualname == "torch.utils.data.DataLoader":
            self._loader(node, where)

    def _loader(self, node: ast.Call, where: str) -> None:
        settings = {
            name: _literal(_kwarg(node, name))
            for name in (
                "batch_size",
                "num_workers",
                "pin_memory",
                "prefetch_factor",
                "persistent_workers",
                "collate_fn",
            )
        }
        if isinstance(_kwarg(node, "collate_fn"), (ast.Name, ast.Attribute)):
            settings["collate_fn"] = ast.unparse(_kwarg(node, "collate_fn"))
        self.loaders.append({"location": where, **{k: v for k, v in settings.items()}})
        problems = []
        if settings["num_workers"] in (None, 0):
            problems.append("num_workers is 0 (batches load in the training process, between device steps)")
        if settings["pin_memory"] in (None, False):
            problems.append("pin_memory is off (host-to-device copies cannot overlap compute)")
        if settings["num_workers"] not in (None, 0) and settings["persistent_workers"] in (None, False):
            problems.append("persistent_workers is off (workers restart every epoch)")
        if problems:
            line, col = self.s.pos(node)
            self.findings.append(
                R.finding(R.DATALOADER, self.s.display, line, col, "DataLoader: " + "; ".join(problems))
            )

    # -- fusion opportunities
    def _sequential(self, node: ast.Call) -> None:
        kinds = []
        for arg in node.args:
            if isinstance(arg, ast.Call):
                qualname = self.s.names.resolve(arg.func) or ""
                kinds.append((qualname[len(_NN) :] if qualname.startswith(_NN) else "", arg))
        for i, (name, arg) in enumerate(kinds):
            nxt = kinds[i + 1][0] if i + 1 < len(kinds) else ""
            after = kinds[i + 2][0] if i + 2 < len(kinds) else ""
            if name.startswith("Conv") and nxt.startswith("BatchNorm") and _KIND_OF.get(after) == "activation":
                self.fusions.append(["conv+bn+act", f"nn.{name} -> nn.{nxt} -> nn.{after}", self.where(arg)])
            elif name == "Linear" and _KIND_OF.get(nxt) == "activation":
                self.fusions.append(["linear+act", f"nn.Linear -> nn.{nxt}", self.where(arg)])

    def _fusion(self, node: ast.Call, qualname: str | None) -> None:
        """`act(self.fc(x))` and `act(self.bn(self.conv(x)))` in a forward pass."""
        name = qualname.rsplit(".", 1)[-1] if qualname else ""
        is_act = qualname is not None and qualname.startswith(_F) and name in _ACTIVATION_FUNCS
        if not is_act or not node.args or not isinstance(node.args[0], ast.Call) or id(node) in self._gated:
            return
        inner = node.args[0]
        chain = []
        while (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and isinstance(inner.func.value, ast.Name)
            and inner.func.value.id == "self"
        ):
            chain.append(inner.func.attr)
            inner = inner.args[0] if inner.args else None
        if not chain:
            return
        attrs = [a.lower() for a in reversed(chain)]
        if len(attrs) >= 2 and "conv" in attrs[0] and ("bn" in attrs[1] or "norm" in attrs[1]):
            self.fusions.append(["conv+bn+act", f"self.{chain[-1]} -> self.{chain[-2]} -> F.{name}", self.where(node)])
        elif any(k in attrs[-1] for k in ("fc", "linear", "proj", "dense", "lin")):
            self.fusions.append(["linear+act", f"self.{chain[0]} -> F.{name}", self.where(node)])

    # -- gradient accumulation: optimizer.step() under `if ... % ...`
    def visit_If(self, node: ast.If) -> None:
        test = ast.unparse(node.test)
        if "%" in test and any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "step"
            for stmt in node.body
            for n in walk(stmt)
        ):
            self.accumulation.append(self.where(node))
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self.operators.append(["matmul", "@", self.where(node)])
        elif isinstance(node.op, ast.Mult):
            self._gated.update((id(node.left), id(node.right)))
        self.generic_visit(node)


def scan(source: Source, context: Context) -> dict | None:
    if "torch" not in source.text:
        return None
    scanner = _Scanner(source)
    scanner.visit(source.tree)
    facts = {
        key: getattr(scanner, key)
        for key in (
            "classes",
            "layers",
            "operators",
            "distributed",
            "amp",
            "checkpointing",
            "accumulation",
            "loaders",
            "fusions",
            "findings",
        )
    }
    return facts if any(facts.values()) else None


# --- project level -----------------------------------------------------------------------------------


def _module_classes(project: Project) -> list[dict]:
    """The nn.Module subclasses: direct ones, and those whose base is one (by local name, to a fixpoint)."""
    classes = [c for _, facts in project.facts("model") for c in facts["classes"]]
    modules = set()
    changed = True
    while changed:
        changed = False
        for c in classes:
            key = (c["module"], c["name"])
            if key in modules:
                continue
            for base in c["bases"]:
                short = base.rsplit(".", 1)[-1]
                if (
                    base in ("torch.nn.Module", "torch.nn.modules.module.Module")
                    or base.endswith(("PreTrainedModel",))
                    or any(m[1] == short for m in modules)
                ):
                    modules.add(key)
                    changed = True
                    break
    return [c for c in classes if (c["module"], c["name"]) in modules]


def _count(n: int, thing: str, things: str) -> str:
    return f"{n} {thing if n == 1 else things}"


def complexity(findings_by_rule: Counter, facts: dict) -> dict:
    """The rating and effort estimate (`effort.rate`) from what the modes found."""
    items = []
    for kind, count, thing, things in (
        (
            "complex_kernel",
            facts["complex_kernels"],
            "CUDA kernel using shared memory, shuffles, atomics or CUDA libraries",
            "CUDA kernels using shared memory, shuffles, atomics or CUDA libraries",
        ),
        ("simple_kernel", facts["simple_kernels"], "plain CUDA kernel", "plain CUDA kernels"),
        ("triton_kernel", facts["triton_kernels"], "triton kernel", "triton kernels"),
        (
            "native_build",
            facts["native_builds"],
            "CUDA extension build or C++ binding to build for the NPU",
            "CUDA extension builds and C++ bindings to build for the NPU",
        ),
        (
            "dynamic_shape",
            facts["dynamic_shapes"],
            "data-dependent shape to measure and pad to fixed sizes",
            "data-dependent shapes to measure and pad to fixed sizes",
        ),
        (
            "fused_declined",
            findings_by_rule.get("declined", 0),
            "fused-kernel candidate to apply by hand",
            "fused-kernel candidates to apply by hand",
        ),
        (
            "sync_in_loop",
            findings_by_rule.get(R.HOST_SYNC.id, 0),
            "host-device sync inside a loop",
            "host-device syncs inside loops",
        ),
    ):
        if count:
            items.append(effort.item(kind, _count(count, thing, things), count))
    for kind, packages, what in (
        ("package_without_alternative", facts["packages_without_alternative"], "with no Ascend counterpart"),
        ("package_with_alternative", facts["packages_with_alternative"], "to switch to an Ascend counterpart"),
    ):
        if packages:
            label = "CUDA-only package" if len(packages) == 1 else "CUDA-only packages"
            items.append(effort.item(kind, f"{label} {what}: {', '.join(packages)}", len(packages)))
    unsupported = sorted(facts["unsupported_apis"])
    if unsupported:
        shown = ", ".join(unsupported[:6]) + (" ..." if len(unsupported) > 6 else "")
        what = _count(len(unsupported), "torch API", "torch APIs") + f" with no NPU support: {shown}"
        items.append(effort.item("unsupported_api", what, len(unsupported)))
    library = facts["unsupported_library_functions"]
    if library:
        what = _count(len(library), "library function", "library functions")
        items.append(
            effort.item(
                "unsupported_library_function",
                f"{what} the code calls that cannot run on an NPU: "
                + ", ".join(library[:4])
                + (" ..." if len(library) > 4 else ""),
                len(library),
            )
        )
    if facts["distributed"]:
        items.append(effort.item("distributed", f"distributed training ({', '.join(facts['distributed'])})"))
    return effort.rate(items, findings_by_rule.get("fixed", 0))


def collect(project: Project, result: ModeResult) -> None:
    gathered: dict[str, list] = defaultdict(list)
    for _, facts in project.facts("model"):
        for key, value in facts.items():
            if key != "classes":
                gathered[key].extend(value)
    result.findings = sorted(gathered["findings"], key=finding_key)
    classes = _module_classes(project)
    for c in classes:
        lowered = c["name"].lower()
        for marker, kind in _CUSTOM_KINDS:
            if marker in lowered:
                gathered["layers"].append([kind, f"{c['name']} (custom)", c["location"]])
                break

    table = package_table()
    layer_rows = _grouped(gathered["layers"])
    op_rows = []
    for (kind, api), locations in _group(gathered["operators"]).items():
        order, status = OPERATORS.get(kind, (9, "native"))
        hit = cuda_package(api, table)
        if hit is not None:
            prefix, entry = hit
            status = f"not available: {prefix} is CUDA-only" + (
                f" (use {entry['alternative']})" if entry["alternative"] else ""
            )
        op_rows.append(
            [order, kind, api, len(locations), status, " ".join(locations[:5]) + (" ..." if len(locations) > 5 else "")]
        )
    op_rows.sort(key=lambda r: (r[0], -r[3], r[2]))

    every = [f for scan in project.files for f in (*scan.findings, *scan.scanner_findings)]
    fusion_rows = [[p, d, loc] for p, d, loc in gathered["fusions"]]
    targets = fused_rule_targets()
    for f in every:
        if f.rule_id in targets and is_fused_site(f):
            pattern = targets[f.rule_id].rsplit(".", 1)[-1].removeprefix("npu_")
            status = (
                "applied by apply: " if f.fixed else "native: " if f.data.get("fused") == "native" else "declined: "
            )
            fusion_rows.append([pattern, status + f.message, f.location()])
        elif f.rule_id == R.AFFINITY_API.id and f.data.get("api") == "torch_npu.npu_fusion_attention":
            fusion_rows.append(["flash_attention", f.message.split(":")[0], f.location()])
    fusion_rows.sort(key=lambda r: (r[0], location_key(r[2])))

    loaders = gathered["loaders"]
    sync_rows = [[f.location(), f.message] for f in result.findings if f.rule_id == R.HOST_SYNC.id]
    memory = {
        "dataloaders": loaders,
        "syncs_in_loops": len(sync_rows),
        "mixed_precision": [a[1] for a in gathered["amp"]],
        "gradient_checkpointing": gathered["checkpointing"],
        "gradient_accumulation": gathered["accumulation"],
    }
    advice = []
    if not gathered["amp"]:
        advice.append(
            "no mixed precision found: bf16 autocast (torch.autocast('npu', dtype=torch.bfloat16)) roughly "
            "halves activation memory and uses the Cube unit's fast path"
        )
    if not gathered["checkpointing"] and classes:
        advice.append(
            "no gradient checkpointing: torch.utils.checkpoint on the repeated blocks trades compute for "
            "activation memory when the model does not fit"
        )
    if not gathered["accumulation"]:
        advice.append(
            "no gradient accumulation: accumulate over N micro-batches to keep the global batch when the "
            "per-card batch must shrink"
        )

    by_rule = Counter()
    for f in every:
        by_rule[f.rule_id] += 1
        if f.fixed:
            by_rule["fixed"] += 1
        elif is_fused_site(f) and f.data.get("fused") != "native":  # native: torch_npu fuses it as it is
            by_rule["declined"] += 1
    packages = {row[2] for row in project.result("third_party").data["packages"]}
    items = project.result("custom_kernels").data["items"]
    cuda_kernels = [i for i in items if i["kind"] == "cuda_kernel"]
    # A kernel's detail lists what its source leans on; "plain CUDA C++" and inline sources lean on nothing known.
    simple = sum(1 for i in cuda_kernels if i["detail"] in ("plain CUDA C++", "inline CUDA source"))
    builds = sum(
        1
        for i in items
        if i["kind"] in ("extension_build", "jit_build", "cuda_cpp") and "host C++" not in i["what_to_port"]
    )
    apis = project.result("torch_apis").data["apis"]
    unsupported = {entry["api"] for entry in apis if entry["status"] == UNSUPPORTED}
    dynamic = len(project.result("dynamic_shape").data["sites"])
    top_level = {p: p.split(".")[0] for p in packages}
    rating = complexity(
        by_rule,
        {
            "complex_kernels": len(cuda_kernels) - simple,
            "simple_kernels": simple,
            "triton_kernels": sum(1 for i in items if i["kind"] == "triton_kernel"),
            "native_builds": builds,
            # Counted per installed package: apex and apex.optimizers are one package to replace.
            "packages_without_alternative": sorted(
                {top_level[p] for p in packages if not table[p]["alternative"]}
                - {top_level[p] for p in packages if table[p]["alternative"]}
            ),
            "packages_with_alternative": sorted({top_level[p] for p in packages if table[p]["alternative"]}),
            "unsupported_apis": unsupported,
            "unsupported_library_functions": sorted({call[1] for call in project.result("third_party").data["calls"]}),
            "distributed": sorted({d[0] for d in gathered["distributed"] if d[0] != "process group"}),
            "dynamic_shapes": dynamic,
        },
    )

    result.tables = [
        Table(
            "model_classes.csv",
            "Model classes (nn.Module subclasses)",
            ["location", "class", "bases"],
            [
                [c["location"], c["name"], " ".join(c["bases"])]
                for c in sorted(classes, key=lambda c: location_key(c["location"]))
            ],
        ),
        Table("model_layers.csv", "Layer inventory", ["kind", "layer", "count", "locations"], layer_rows),
        Table(
            "model_operators.csv",
            "Heavy operators (cost order)",
            ["cost_order", "kind", "operator", "count", "ascend", "locations"],
            op_rows,
        ),
        Table("model_fusion.csv", "Fusion opportunities", ["pattern", "detail", "location"], fusion_rows),
        Table(
            "model_distributed.csv",
            "Distributed setup and AMP",
            ["what", "detail", "location"],
            [*gathered["distributed"], *gathered["amp"]],
        ),
        Table(
            "model_dataloaders.csv",
            "DataLoaders",
            [
                "location",
                "batch_size",
                "num_workers",
                "pin_memory",
                "prefetch_factor",
                "persistent_workers",
                "collate_fn",
            ],
            [
                [
                    d["location"],
                    *(
                        _cell(d[k])
                        for k in (
                            "batch_size",
                            "num_workers",
                            "pin_memory",
                            "prefetch_factor",
                            "persistent_workers",
                            "collate_fn",
                        )
                    ),
                ]
                for d in loaders
            ],
        ),
        Table("model_syncs.csv", "Host-device syncs in loops", ["location", "detail"], sync_rows),
    ]
    result.summary = [
        f"{len(classes)} model classes; layers: "
        + (", ".join(f"{r[0]} {r[2]}" for r in _kind_totals(layer_rows)) or "none"),
        f"distributed: {', '.join(sorted({d[0] + ' ' + d[1] for d in gathered['distributed']})) or 'none'}; "
        f"AMP: {', '.join(sorted({a[0] for a in gathered['amp']})) or 'none'}; "
        f"{len(sync_rows)} host-device syncs in loops; {len(loaders)} DataLoaders",
        f"migration complexity: {rating['rating']} ({rating['effort']}); the largest item: {rating['reasons'][0]}",
    ]
    result.data = {
        "classes": classes,
        "layers": [dict(zip(result.tables[1].header, r)) for r in layer_rows],
        "operators": [dict(zip(result.tables[2].header, r)) for r in op_rows],
        "fusion": [dict(zip(result.tables[3].header, r)) for r in fusion_rows],
        "distributed": [dict(zip(result.tables[4].header, r)) for r in gathered["distributed"]],
        "amp": [dict(zip(result.tables[4].header, r)) for r in gathered["amp"]],
        "memory": memory,
        "advice": advice,
        "complexity": rating,
    }


def _cell(value) -> str:
    return "" if value is None else str(value)


def _group(rows: list[list]) -> dict[tuple[str, str], list[str]]:
    grouped: dict[tuple[str, str], list[str]] = {}
    for kind, name, location in rows:
        grouped.setdefault((kind, name), []).append(location)
    return grouped


def _grouped(rows: list[list]) -> list[list]:
    out = [
        [kind, name, len(locs), " ".join(locs[:5]) + (" ..." if len(locs) > 5 else "")]
        for (kind, name), locs in _group(rows).items()
    ]
    return sorted(out, key=lambda r: (r[0], -r[2], r[1]))


def _kind_totals(layer_rows: list[list]) -> list[tuple[str, str, int]]:
    totals = Counter()
    for kind, _, count, _ in layer_rows:
        totals[kind] += count
    return [(kind, "", n) for kind, n in sorted(totals.items())]


MODE = Mode(
    "model",
    "Model",
    scan=scan,
    collect=collect,
    reads=("torch_apis", "third_party", "custom_kernels", "dynamic_shape"),
)
