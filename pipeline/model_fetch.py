"""`mempipe models list|fetch -c CONFIG`: the models a config needs, where each is, and downloading them.

`fetch` downloads every hub model the config needs into the cache its loader reads (huggingface_hub's
progress bars), skipping weights in formats no loader here reads; a spaCy pipeline is a pip package,
so it prints the pip command. Exit 0 when every model is here afterwards, else ModelsMissing.EXIT_CODE.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, Callable

from pipeline.config import project_dirs, resolve_paths
from pipeline.models_needed import (ModelNeed, ModelsMissing, cache_dirs, hub_endpoint, hub_ids, hub_reachable,
                                    locate, looks_like_path, models_needed, offline_by_env)

if TYPE_CHECKING:
    from pipeline.config import RunConfig

# Other frameworks' weights and exports (TensorFlow, Flax, Rust, ONNX, OpenVINO, Core ML): torch
# loaders never read them, and roberta-large's alone would add 4 GB.
_IGNORE = ["*.h5", "*.msgpack", "*.ot", "*.onnx", "onnx/*", "openvino/*", "*.tflite", "coreml/*", "*.mlmodel",
           "*.mlpackage/*"]


def _options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("-c", "--config", default=None, help="YAML config (default: built-in defaults)")
    sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    sp.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")


def _config(args: argparse.Namespace) -> RunConfig:
    return resolve_paths(args.app.load_config(args.config, args.set), search=project_dirs(args.config))


def add_models_command(subparsers: Any, common: Callable[[argparse.ArgumentParser], None] | None = None,
                       config: Callable[[argparse.Namespace], RunConfig] | None = None) -> None:
    """`models list` and `models fetch` under the CLI's subparsers; `common` adds -c/--set/--debug
    and `config` loads the config from them (the CLI's own helpers, so that the config is exactly
    the one the other commands load; without them, the same options and loading)."""
    models = subparsers.add_parser("models", help="the models a config needs: list where each is, or fetch them")
    sub = models.add_subparsers(dest="models_command", required=True)
    listed = sub.add_parser("list", help="each model the config needs and where it is found (or missing)")
    fetch = sub.add_parser("fetch", help="download every model the config needs that is not here (with progress)")
    for sp in (listed, fetch):
        (common or _options)(sp)
        sp.set_defaults(func=cmd_models, config_of=config or _config)


def _needs(args: argparse.Namespace) -> list[ModelNeed]:
    cfg = getattr(args, "config_of", _config)(args)
    return models_needed(cfg, args.app.registry(cfg))


def _describe(need: ModelNeed) -> str:
    return f"{need.name} ({need.config_key})"


def cmd_models(args: argparse.Namespace) -> int:
    needs = _needs(args)
    if not needs:
        print("this config needs no model beyond the packaged ones")
        return 0
    if args.models_command == "list":
        for need in needs:
            where = locate(need)
            shown = f"packaged ({need.install.split()[-1]})" if need.kind == "packaged" and need.install else where
            print(f"{need.kind:21s} {_describe(need)}: {shown or 'missing'}")
        return 0
    return _fetch(needs)


def _fetch(needs: list[ModelNeed]) -> int:
    left: list[str] = []
    for need in needs:
        where = locate(need)
        if where is not None:
            print(f"{_describe(need)}: here ({where})")
        elif need.kind == "spacy":
            left.append(f"model {_describe(need)} is a pip package: {need.install or 'pip install ' + need.name}")
        elif looks_like_path(need.name):
            left.append(f"model folder {_describe(need)} does not exist: fix {need.config_key} or put the model there")
        elif offline_by_env():
            left.append(f"model {_describe(need)}: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE is set, so nothing is "
                        "downloaded: unset it where the hub is reachable")
        elif not hub_reachable():  # asked once: huggingface_hub would retry each file for half a minute
            left.append(f"model {_describe(need)}: the hub ({hub_endpoint()}) does not answer from here: "
                        "run this where it does")
        else:
            print(f"{_describe(need)}: downloading", flush=True)
            try:
                print(f"{_describe(need)}: {_download(need)}")
            except Exception as e:  # noqa: BLE001 - hub, network, disk: report and go on with the others
                first = (str(e).strip().splitlines() or [""])[0][:200]
                left.append(f"model {_describe(need)} could not be downloaded ({type(e).__name__}: {first})")
    for line in left:
        print(f"mempipe: {line}", file=sys.stderr)
    return ModelsMissing.EXIT_CODE if left else 0


def _plain_transformers_names() -> frozenset[str]:
    """Names sentence-transformers leaves without its "sentence-transformers/" prefix (bert-base-uncased,
    ...); importing it takes seconds (torch), so only a fetch of such a name asks."""
    from sentence_transformers.util import ORIGINAL_TRANSFORMER_MODELS

    return frozenset(ORIGINAL_TRANSFORMER_MODELS)


def _repo_for(need: ModelNeed) -> str:
    """The repo id the loader will ask for."""
    if need.kind == "sentence-transformers" and "/" not in need.name \
            and need.name.lower() in _plain_transformers_names():
        return need.name
    return hub_ids(need)[0]


def _skipped_duplicates(files: list[str]) -> list[str]:
    """pytorch_model*.bin beside model*.safetensors in the same folder: loaders take the safetensors."""
    folders_with_safetensors = {f.rpartition("/")[0] for f in files
                                if f.rpartition("/")[2].startswith("model") and f.endswith((".safetensors",
                                                                                           ".safetensors.index.json"))}
    return [f for f in files if f.rpartition("/")[2].startswith("pytorch_model")
            and f.rpartition("/")[0] in folders_with_safetensors]


def _download(need: ModelNeed) -> str:
    from huggingface_hub import list_repo_files, snapshot_download

    repo = _repo_for(need)
    try:
        ignore = [*_IGNORE, *_skipped_duplicates(list_repo_files(repo))]
    except Exception:  # noqa: BLE001 - the listing only saves disk; the download says what is wrong
        ignore = list(_IGNORE)
    return snapshot_download(repo, cache_dir=cache_dirs(need)[0], ignore_patterns=ignore)
