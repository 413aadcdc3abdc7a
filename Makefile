# Hearth from a fresh clone: `make run` starts the app, `make test` runs the tests.
# Both create .venv with python3 and install Hearth into it with the pinned
# versions of constraints.txt; pip runs again only when those files change.

PYTHON ?= python3
VENV := .venv
VENV_PYTHON := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: run test install model triton check-qt-libs

run: install check-qt-libs model
	$(VENV)/bin/hearth

test: install model triton
	QT_QPA_PLATFORM=offscreen $(VENV_PYTHON) -m pytest

install: $(INSTALLED)

$(VENV_PYTHON):
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): $(VENV_PYTHON) pyproject.toml setup.py constraints.txt
	$(VENV_PYTHON) -m pip install --quiet --constraint constraints.txt --upgrade pip
	$(VENV_PYTHON) -m pip install --constraint constraints.txt --editable '.[test]'
	touch $(INSTALLED)

# Triton for the tests that run the CUDA path's kernels in its interpreter, in a folder of its own that only their
# subprocess imports: in .venv, PyTorch would import it beside every transformers model (Linux x86-64 only).
TRITON_SITE := .triton
triton: install
	@if [ "$$(uname -s)-$$(uname -m)" = Linux-x86_64 ]; then $(MAKE) --no-print-directory $(TRITON_SITE)/.installed; fi

$(TRITON_SITE)/.installed: constraints.txt
	rm -rf $(TRITON_SITE)
	$(VENV_PYTHON) -m pip install --quiet --constraint constraints.txt --no-deps --target $(TRITON_SITE) triton
	touch $@

# The built-in model (about 100 MB, once) into the user's cache folder.
model: install
	$(VENV_PYTHON) -m engine.models.default_model

# On Linux with no QT_QPA_PLATFORM chosen, the window needs Qt's X11 plugin libraries.
check-qt-libs: install
	@if [ -z "$$QT_QPA_PLATFORM" ] && [ "$$(uname -s)" = Linux ]; then \
		packaging/check_qt_libs.sh $(VENV_PYTHON); \
	fi
