# `make train` and `make test` work on a fresh clone: the first call creates .venv (idempotent, quick after).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTHON ?= python3

export OMP_NUM_THREADS ?= 1
export DS_ACCELERATOR ?= cpu
export WANDB_MODE ?= offline
export WANDB_SILENT ?= true
# Persistent JIT cache for DeepSpeed's shm comm op: compiled once (~45 s), then reused.
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/$(VENV)/torch_extensions
# The venv first on PATH for every target, so every process (tests, launchers, the emulated cluster's ranks) runs
# the venv's ninja: a second ninja on PATH (the system's) hashes the same build command differently and made each
# switch between the two recompile the op above (~40 s, four times per `make test`).
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

MODEL ?= resnet101
CONFIG ?= ds_configs/default.json
# Two pytest workers (pytest-xdist), one per core, whole files to one worker (module fixtures shared). A third
# worker won in a warm working tree (797 s against 1,003 s, other cuts included) but not on a clean clone here
# (930 s against 929 s), and CI's wall time rose with it (1,012 s -> 1,115 s with set-up, though the suite had
# fewer launches): each worker's launches start several processes. Files go out in the order tests/conftest.py
# sorts them (the slow launcher files first). PYTEST_WORKERS=0 runs serially.
PYTEST_WORKERS ?= 2
PYTEST_ARGS ?=

.PHONY: setup test train bench clean

$(STAMP): setup.py constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[hf,wandb,bench,test]"
	$(PY) -c 'import site, sys; open(site.getsitepackages()[0] + "/ds_gravac_repo.pth", "w").write(sys.argv[1] + "\n")' "$(CURDIR)"
	$(PY) runners/warm_ops.py
	@grep -q TORCH_EXTENSIONS_DIR $(VENV)/bin/activate || echo 'export TORCH_EXTENSIONS_DIR="$(CURDIR)/$(VENV)/torch_extensions"  # the op make setup compiled' >> $(VENV)/bin/activate
	@touch $(STAMP)

setup: $(STAMP)

test: setup
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

train: setup
	bash runners/make_train.sh "$(MODEL)" "$(CONFIG)"

bench: setup
	$(PY) -m ds_gravac_bench.micro --sets resnet101 --out runs/micro.json

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
