# wisp: `make run` boots the bundled hello VM; `make test` runs every test.
SHELL := /bin/bash
CARGO ?= cargo
GUEST_TARGET := x86_64-unknown-none
# Every crate under guest/apps is an app (the workspace takes them all too).
GUEST_APPS := $(sort $(patsubst guest/apps/%/Cargo.toml,%,$(wildcard guest/apps/*/Cargo.toml)))
TEST_PACKAGES := hostile
TEST_IMAGES := hostile hostile-lone
IMAGES := build/images
# Every crate under guest/libs is a guest shared library: build/libs/NAME.so.
GUEST_LIBS := $(sort $(patsubst guest/libs/%/Cargo.toml,%,$(wildcard guest/libs/*/Cargo.toml)))
LIBS := build/libs
# rustc's own linker (x86_64-unknown-none makes no cdylib: a library is a
# staticlib of position-independent objects linked -shared here).
RUST_LLD = $(shell rustc --print sysroot)/lib/rustlib/$(shell rustc -vV | sed -n 's/^host: //p')/bin/rust-lld
WISP := target/release/wisp

.PHONY: all deps host guest libs run test install uninstall fuzz bench-boot bench-net bench-density bench-fork bench-app bench-cache bench-cdnsim bench-snapshot bench-libs bench-usecases bench-oci demo-cache demo-migrate demo-firewall demo-tls demo-oci clean
N ?= 10000

all: host guest libs

# Toolchain pieces and Debian packages the build and tests need.
deps:
	@scripts/install-deps.sh

host: deps
	$(CARGO) build --release

# A failed build leaves no image behind: the old one would run as if new.
guest: deps
	@mkdir -p $(IMAGES)
	@for i in $(GUEST_APPS) $(TEST_IMAGES); do rm -f $(IMAGES)/$$i; done
	$(CARGO) build --profile guest --target $(GUEST_TARGET) $(addprefix -p ,$(GUEST_APPS) $(TEST_PACKAGES))
	@for i in $(GUEST_APPS) $(TEST_IMAGES); do cp target/$(GUEST_TARGET)/guest/$$i $(IMAGES)/$$i; done

# A library links against nothing (--no-undefined), exports what its
# exports.map names, puts each segment in 2 MiB pages of its own (the
# monitor maps it with 2 MiB pages, each with its segment's permissions;
# the file stays small: segments are congruent, not padded), is stripped,
# and is signed as its crate's version
# with the repository's test key (guest/libs/test.key: public, for tests
# and demos); a failed link leaves no library.
libs: deps host
	@mkdir -p $(LIBS)
	@for l in $(GUEST_LIBS); do rm -f $(LIBS)/$$l.so; done
	$(CARGO) build --profile guest --target $(GUEST_TARGET) $(addprefix -p wisplib-,$(GUEST_LIBS))
	@for l in $(GUEST_LIBS); do \
	    $(RUST_LLD) -flavor gnu -shared --no-undefined --gc-sections --strip-all -z max-page-size=0x200000 -z common-page-size=0x1000 -z noseparate-code \
	        --hash-style=both --version-script guest/libs/$$l/exports.map -soname $$l.so \
	        --whole-archive target/$(GUEST_TARGET)/guest/libwisplib_$$l.a -o $(LIBS)/$$l.so.unsigned || exit 1; \
	    chmod 600 guest/libs/test.key; \
	    $(WISP) lib sign --key guest/libs/test.key --version $$(sed -n 's/^version = "\(.*\)"/\1/p' guest/libs/$$l/Cargo.toml) \
	        --out $(LIBS)/$$l.so $(LIBS)/$$l.so.unsigned >/dev/null && rm $(LIBS)/$$l.so.unsigned || exit 1; \
	done

# `make && make install`: the command line, the daemon and the OCI runtime
# on the PATH (PREFIX/bin), the bundled images and libraries where they
# find them (PREFIX/share/wisp). Builds nothing itself: images being
# rebuilt under running tests would vanish for a moment.
PREFIX ?= /usr/local
BINS := wisp wispd wisp-oci
install:
	@for b in $(BINS); do test -x target/release/$$b || { echo "install: target/release/$$b missing: run make first" >&2; exit 1; }; done
	@test -e $(IMAGES)/hello || { echo "install: $(IMAGES) missing: run make first" >&2; exit 1; }
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/wisp/images $(DESTDIR)$(PREFIX)/share/wisp/libs
	install -m 755 $(addprefix target/release/,$(BINS)) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(IMAGES)/* $(DESTDIR)$(PREFIX)/share/wisp/images/
	if ls $(LIBS)/*.so >/dev/null 2>&1; then install -m 644 $(LIBS)/*.so $(DESTDIR)$(PREFIX)/share/wisp/libs/; fi

uninstall:
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/bin/,$(BINS))
	rm -rf $(DESTDIR)$(PREFIX)/share/wisp

run: all
	$(WISP) run --stats hello -- from make run

test: all
	$(CARGO) test --release

# Fuzzing (cargo fuzz, libFuzzer; not part of `make test`): each target for
# FUZZ_SECONDS, starting from the committed seeds in fuzz/corpus/<target>;
# what it finds goes to fuzz/target/corpus/<target>, crashes to
# fuzz/artifacts/<target>/. `make fuzz FUZZ_TARGETS=http_request FUZZ_SECONDS=600`.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= image_parse http_request http_response boot_args image_note family_call api_action nic_ring
fuzz:
	@scripts/install-fuzz-deps.sh
	cd fuzz && cargo +nightly fuzz build
	@cd fuzz && fail=; for t in $(FUZZ_TARGETS); do \
		mkdir -p target/corpus/$$t; \
		echo "== fuzz $$t for $(FUZZ_SECONDS) s"; \
		cargo +nightly fuzz run $$t target/corpus/$$t corpus/$$t -- \
			-max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
			|| fail="$$fail $$t"; \
	done; \
	if [ -n "$$fail" ]; then echo "fuzz: crashes in:$$fail (reproducers in fuzz/artifacts/)"; exit 1; fi

bench-boot: all
	scripts/install-bench-deps.sh
	python3 bench/boot.py --wisp $(WISP) --out bench/results/boot.json

bench-net: all
	scripts/install-bench-deps.sh
	python3 bench/net.py --wisp $(WISP) --out bench/results/net.json

bench-fork: all
	scripts/install-bench-deps.sh
	python3 bench/fork.py --wisp $(WISP) --out bench/results/fork.json

bench-cache: all
	scripts/install-bench-deps.sh
	python3 bench/cache.py --wisp $(WISP) --out bench/results/cache.json

bench-cdnsim: host
	scripts/install-bench-deps.sh
	python3 bench/cdnsim.py --cdnsim target/release/cdnsim --out bench/results/cdnsim.json

# Snapshots: save and restore latency as running VMs grow (10, 100, 1000),
# restore against a warm boot (docs/snapshots.md, docs/benchmarks.md).
bench-snapshot: all
	scripts/install-bench-deps.sh
	python3 bench/snapshot.py --wisp $(WISP) --out bench/results/snapshot.json

# Shared libraries: live update of 111 functions + 111 variables in a
# running VM, host memory of 1,000 VMs sharing a 1 MiB library
# (docs/libraries.md, docs/benchmarks.md).
bench-libs: all
	scripts/install-bench-deps.sh
	python3 bench/libs.py --wisp $(WISP) --out bench/results/libs.json

bench-usecases: all
	scripts/install-bench-deps.sh
	python3 bench/usecases.py --wisp $(WISP) --out bench/results/usecases.json

bench-oci: all
	scripts/install-bench-deps.sh
	python3 bench/oci.py --runtime target/release/wisp-oci --out bench/results/oci.json

# The content cache in one command: a volume from docs/, a cache VM, curl.
demo-cache: all
	scripts/demo-cache.sh

demo-migrate: all
	scripts/demo-migrate.sh

demo-firewall: all
	scripts/demo-firewall.sh

demo-tls: all
	scripts/demo-tls.sh

# wisp as an OCI runtime under podman in one command (docs/oci.md).
demo-oci: all
	scripts/demo-oci.sh

bench-app: all
	python3 bench/app.py --wisp $(WISP) --out bench/results/app.json

bench-density: all
	python3 bench/density.py --wisp $(WISP) --n $(N)

clean:
	$(CARGO) clean
	rm -rf build
