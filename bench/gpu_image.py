"""What the GPU machine's Python has, and what bench/gpu.sh brings to it as wheels.

The device machine has no network. Its python3 (3.12, itself a venv) holds torch (CUDA),
transformers, safetensors and the other distributions of `IMAGE`, as last read from that
machine's image (2026-11-17), but not pydantic, SQLAlchemy, FastAPI and the rest of `WHEELS`,
which store/, the service and the worker import. `bench/gpu.sh --fetch-wheels` downloads
`WHEELS` for CPython 3.12 into .whl/; on the device the script installs them with
`pip install --target` onto PYTHONPATH.

The versions are the ones the dry run was checked with (the development venv's). A
distribution of the image that the project needs in a newer version goes into `WHEELS` too:
pydantic 2.14 needs typing-extensions >= 4.16, which the image may not have.

    python -m bench.gpu_image wheels          # NAME==VERSION, one a line
    python -m bench.gpu_image blocker DIR     # DIR/sitecustomize.py: see `write_blocker`

Nothing here imports a third-party package: it runs before any is installed.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

WHEELS = {
    # store/ (specs, plans) and everything that reads them
    "pydantic": "2.14.4",
    "pydantic-core": "2.50.5",
    "annotated-types": "0.8.0",
    "typing-inspection": "0.4.5",
    "typing-extensions": "4.16.0",
    # the run database: the worker claims from it, the service writes it
    "sqlalchemy": "2.1.9",
    "alembic": "1.20.1",
    "mako": "1.4.3",
    # the service and its settings (bench/gpu_train.py submits through the API)
    "fastapi": "0.165.0",
    "starlette": "1.10.0",
    "uvicorn": "0.54.0",
    "pydantic-settings": "2.16.3",
    "python-dotenv": "1.2.4",
    "opentelemetry-api": "1.45.2",  # fastapi imports it at its own import
    "anyio": "4.16.0",
}

IMAGE_LIST = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf
psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug
wheel wrapt xarray xxhash yarl zipp
"""
IMAGE = frozenset(IMAGE_LIST.split())


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def there() -> set[str]:
    """The distributions the device's python3 will have: the image's, the wheels, this
    project."""
    return {normalize(n) for n in [*IMAGE, *WHEELS, "trainctl"]}


def blocked_modules() -> list[str]:
    """Top-level modules importable here whose distributions are none of `there()`: on the
    device they would not import. Modules of no distribution (the standard library, this
    repository's own folders) are never blocked."""
    allowed = there()
    return sorted(
        module
        for module, dists in metadata.packages_distributions().items()
        if not any(normalize(d) in allowed for d in dists)
    )


def blocked_distributions() -> list[str]:
    """The distributions installed here that are none of `there()`, as `normalize` spells
    them: on the device `importlib.metadata` finds none of them."""
    allowed = there()
    names = {normalize(d.metadata["Name"] or "") for d in metadata.distributions()}
    return sorted(names - allowed - {""})


BLOCKER = '''"""Made by bench/gpu_image.py for bench/gpu.sh --dry-run: the modules and
distributions below are not on the GPU machine's image, nor among the wheels bench/gpu.sh
brings, so here they are absent as they are there.

Absent, not broken: a probe (`importlib.util.find_spec`, `importlib.metadata.version`, as
transformers makes for every optional dependency at its import) finds nothing, and an import
raises ModuleNotFoundError. So every finder already on sys.meta_path is wrapped: none of them
can find a blocked name, whichever of them would have."""
import re
import sys

BLOCKED = frozenset({blocked!r})
BLOCKED_DISTRIBUTIONS = frozenset({blocked_distributions!r})


def _normal(name):
    return re.sub(r"[-_.]+", "-", name or "").lower()


class NotOnTheGpuImage:
    def __init__(self, inner):
        self._inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            return None
        return self._inner.find_spec(name, path, target)

    def find_distributions(self, *args, **kwargs):
        inner = getattr(self._inner, "find_distributions", None)
        for dist in inner(*args, **kwargs) if inner else ():
            if _normal(dist.metadata["Name"]) not in BLOCKED_DISTRIBUTIONS:
                yield dist

    def __getattr__(self, attr):
        return getattr(self._inner, attr)


sys.meta_path[:] = [NotOnTheGpuImage(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
_excepthook = sys.excepthook


def _say_where(kind, error, tb):
    """A process that dies of a blocked import says why, as the device would not."""
    _excepthook(kind, error, tb)
    if isinstance(error, ModuleNotFoundError) and (error.name or "").partition(".")[0] in BLOCKED:
        print(
            f"({{error.name!r}} is not on the GPU machine: bench/gpu_image.py lists its image "
            "and the wheels that bench/gpu.sh brings)",
            file=sys.stderr,
        )


sys.excepthook = _say_where
'''


def write_blocker(folder: Path) -> Path:
    """A sitecustomize.py in `folder` that makes every `blocked_modules()` module and
    `blocked_distributions()` distribution absent, as on the device: with `folder` first on
    PYTHONPATH, each Python process of the dry run (the service, the worker, torchrun's
    ranks) imports only what the device has."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sitecustomize.py"
    path.write_text(
        BLOCKER.format(blocked=blocked_modules(), blocked_distributions=blocked_distributions())
    )
    return path


def main(argv: list[str]) -> int:
    if argv == ["wheels"]:
        print("\n".join(f"{name}=={version}" for name, version in WHEELS.items()))
        return 0
    if len(argv) == 2 and argv[0] == "blocker":
        path = write_blocker(Path(argv[1]))
        print(f"{path}: {len(blocked_modules())} modules blocked")
        return 0
    print("usage: python -m bench.gpu_image (wheels | blocker DIR)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
