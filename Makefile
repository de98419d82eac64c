# Two commands do everything on a fresh machine:
#   make demo   set up, then run the main job (concurrent writers, a conflict, a failed write, reads)
#   make test   set up, then run the whole test suite  (make unit: the fast unit tests alone)
# Set-up is idempotent: a virtualenv in .venv with cowrite and its extras, the Debian ZooKeeper
# server the tests start on 127.0.0.1, and Debian's chromium, which the daemon page's test drives headless.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Every Spark driver the tests and the demo start loads its classes from this archive, made once at set-up
# (tests/support/spark_classes.py), and starts sooner; a driver that cannot use it starts as without it.
# Their drivers live seconds and run small jobs: the quick compiler alone (no second, optimising one
# competing for two cores) and the serial collector start them sooner still (figures in bench/README.md).
SPARK_CLASSES := $(abspath $(VENV))/spark-classes.jsa
export SPARK_SUBMIT_OPTS += -XX:SharedArchiveFile=$(SPARK_CLASSES) -Xlog:cds=off -Xlog:cds+dynamic=off \
	-XX:TieredStopAtLevel=1 -XX:+UseSerialGC

.PHONY: setup bytecode test unit demo bench lint

setup: $(VENV)/.installed $(SPARK_CLASSES)

$(VENV)/.installed: pyproject.toml
	@test -f /usr/share/java/zookeeper.jar || { \
		echo "installing the Debian zookeeper package (the tests start a real ZooKeeper server)"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q zookeeper; }
	@test -f /usr/share/java/zookeeper.jar || { echo "zookeeper is still missing: apt-get install zookeeper" >&2; exit 1; }
	@command -v java >/dev/null || { echo "java is missing: apt-get install default-jre-headless" >&2; exit 1; }
	@command -v chromium >/dev/null || { \
		echo "installing the Debian chromium package (the daemon page's test drives it headless)"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }
	@command -v chromium >/dev/null || { echo "chromium is still missing: apt-get install chromium" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,spark]'
	touch $@

$(SPARK_CLASSES): $(VENV)/.installed
	$(BIN)/python tests/support/spark_classes.py $@

# Every process the tests and the demo start imports cowrite. Where PYTHONDONTWRITEBYTECODE is set, Python
# writes no bytecode, and each process compiled cowrite's modules anew; compiled here once (under a second,
# and nothing for files already compiled), they are loaded instead. A module edited since is compiled again:
# Python compares the source's time. Figures in bench/README.md.
bytecode: setup
	$(BIN)/python -m compileall -q cowrite tests bench

test: bytecode
	$(BIN)/python -m pytest -q -p no:cacheprovider

unit: bytecode
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit

demo: bytecode
	$(BIN)/cowrite demo

bench: setup
	$(BIN)/python bench/commit_throughput.py

lint: setup
	$(BIN)/ruff check cowrite tests bench
	$(BIN)/mypy
