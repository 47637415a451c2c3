# images/guest/guest.mk — included by the top-level Makefile.
# `make guest-image` builds the lab guest (u-root + Debian kernel as a UKI on
# the ESP of a GPT raw disk) into $GPUAAS_IMAGE_CACHE (default
# ~/.cache/gpuaas/images/<input-hash>/); a second run finds it cached.
.PHONY: guest-image
guest-image: deps
	$(GO) run ./images/cmd/mkguest

# `make guest-image-cuda` builds the lab CUDA developer image: the same
# guest plus qemu_fw_cfg and the simulated nvidia-smi (lab/guestgpu).
.PHONY: guest-image-cuda
guest-image-cuda: deps
	$(GO) run ./images/cmd/mkguest -variant cuda

# `make app-image` builds the repository's test app (images/apps/hello) as
# an OCI image layout archive, bin/apps/hello.oci.tar, and prints its
# reference by digest (the same digest on every build).
.PHONY: app-image
app-image:
	$(GO) run ./images/cmd/mkapp -o $(BIN)/apps/hello.oci.tar
