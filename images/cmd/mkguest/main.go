// Command mkguest builds (or finds in the cache) the lab's tiny guest image
// and prints its path and manifest. `make guest-image` runs it.
//
//	mkguest [-cache DIR] [-kernel /boot/vmlinuz-X] [-variant base|cuda] [-json]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/gpuaas/gpuaas/images/guest"
)

func main() {
	cache := flag.String("cache", "", "image cache root (default $GPUAAS_IMAGE_CACHE or ~/.cache/gpuaas/images)")
	kernel := flag.String("kernel", "", "kernel to boot (default: newest /boot/vmlinuz-*)")
	asJSON := flag.Bool("json", false, "print the manifest as JSON")
	variant := flag.String("variant", guest.VariantBase, "image flavour: base, or cuda (the lab CUDA developer image)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	start := time.Now()
	m, path, err := guest.Image(ctx, guest.Options{CacheRoot: *cache, Kernel: *kernel, Variant: *variant, Log: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkguest:", err)
		os.Exit(1)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			Path string `json:"path"`
			guest.Manifest
		}{path, m}); err != nil {
			fmt.Fprintln(os.Stderr, "mkguest:", err)
			os.Exit(1)
		}
		return
	}
	fmt.Printf("%s\n  %s %s sha256=%s size=%d kernel=%s u-root=%s (%s)\n",
		path, m.Name, m.Version, m.SHA256, m.Size, m.KernelVersion, m.URootVersion, time.Since(start).Round(time.Millisecond))
}
