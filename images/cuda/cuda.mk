# images/cuda/cuda.mk — included by the top-level Makefile.
# `make cuda-image` builds the production CUDA developer slice image from
# Ubuntu's cloud image (NVIDIA open driver, CUDA toolkit, fabric manager,
# persistenced; pinned). It needs NVIDIA's repository and Ubuntu's image
# server (or mirrors: GPUAAS_CUDA_REPO, GPUAAS_UBUNTU_IMAGES) and refuses
# with a clear message when they are unreachable. `make cuda-image-print`
# shows the generated recipe offline.
.PHONY: cuda-image cuda-image-print
cuda-image:
	$(GO) run ./images/cmd/mkcuda
cuda-image-print:
	$(GO) run ./images/cmd/mkcuda -print
