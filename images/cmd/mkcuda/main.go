// Command mkcuda builds the production slice images from Ubuntu's cloud
// image (package images/cuda): the CUDA developer image by default, or the
// base image with -base. It needs Ubuntu's image server and NVIDIA's CUDA
// repository (or mirrors of them) and refuses, before writing anything,
// when they are unreachable. `make cuda-image` runs it. -print shows the
// recipe's generated files without building.
//
//	mkcuda [-base] [-print] [-cache DIR] [-repo URL] [-base-server URL] [-base-keyring FILE]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"

	"github.com/gpuaas/gpuaas/images/cuda"
)

// exitUnreachable is the exit status when a source is unreachable.
const exitUnreachable = 3

func main() {
	base := flag.Bool("base", false, "build the base image (no CUDA layer)")
	print := flag.Bool("print", false, "print the manifest, apt pins, cloud-init config and script; build nothing")
	cache := flag.String("cache", "", "image cache root (default $GPUAAS_IMAGE_CACHE or ~/.cache/gpuaas/images)")
	repo := flag.String("repo", os.Getenv("GPUAAS_CUDA_REPO"), "mirror of NVIDIA's CUDA repository (default $GPUAAS_CUDA_REPO, else NVIDIA's)")
	server := flag.String("base-server", os.Getenv("GPUAAS_UBUNTU_IMAGES"), "mirror of cloud-images.ubuntu.com/releases (default $GPUAAS_UBUNTU_IMAGES)")
	keyring := flag.String("base-keyring", "", "keyring holding Ubuntu's cloud image key (default "+cuda.DefaultBaseKeyring+")")
	flag.Parse()
	r := cuda.CUDARecipe()
	if *base {
		r = cuda.BaseRecipe()
	}
	if *print {
		m, err := json.MarshalIndent(r.Manifest(), "", "  ")
		if err != nil {
			fail(err, 1)
		}
		fmt.Printf("# manifest\n%s\n\n# %s\n%s\n# %s\n%s\n# %s\n%s\n# customize.sh\n%s", m, cuda.CloudCfgPath, r.CloudConfig(),
			cuda.AptPrefsPath, r.AptPreferences(), cuda.AptSourcePath, r.AptSource(), r.Script())
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	m, path, err := cuda.Build(ctx, cuda.Options{Recipe: r, CacheRoot: *cache, RepoURL: *repo, BaseServer: *server, BaseKeyring: *keyring, Log: log})
	var ue *cuda.UnreachableError
	if errors.As(err, &ue) {
		fail(err, exitUnreachable)
	}
	if err != nil {
		fail(err, 1)
	}
	fmt.Printf("%s\n  %s %s kind=%s sha256=%s size=%d marker_sha256=%s\n", path, m.Name, m.Version, m.Kind, m.SHA256, m.Size, m.MarkerSHA256)
}

func fail(err error, code int) {
	fmt.Fprintln(os.Stderr, "mkcuda:", err)
	os.Exit(code)
}
