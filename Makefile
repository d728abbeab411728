# Conveniences; the README's two commands are scripts/demo.sh and scripts/test.sh.
.PHONY: setup demo test bench clean
setup:
	./scripts/setup.sh
demo:
	./scripts/demo.sh
test:
	./scripts/test.sh
bench: setup
	.venv/bin/python bench/determinizer.py
clean:
	rm -rf build .venv examples/bin *.egg-info
