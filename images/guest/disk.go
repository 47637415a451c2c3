package guest

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

const (
	sectorSize = 512
	mib        = 1 << 20
)

// diskSizeMiB is the image size: at least minMiB, and room for the UKI on
// the ESP (GPT, alignment and FAT overhead plus a quarter spare), rounded
// up to 16 MiB.
func diskSizeMiB(ukiBytes, minMiB int64) int64 {
	need := (ukiBytes+ukiBytes/4)/mib + 8
	if need < minMiB {
		need = minMiB
	}
	return (need + 15) / 16 * 16
}

// partition is a partition's sector range.
type partition struct{ First, Last int64 }

// parseSgdiskInfo reads "First sector:" and "Last sector:" from the output
// of `sgdisk -i N`.
func parseSgdiskInfo(out string) (partition, error) {
	var p partition
	seen := 0
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var dst *int64
		switch strings.TrimSpace(k) {
		case "First sector":
			dst = &p.First
		case "Last sector":
			dst = &p.Last
		default:
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			return partition{}, fmt.Errorf("sgdisk: %q has no sector number", line)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return partition{}, fmt.Errorf("sgdisk: %q: %w", line, err)
		}
		*dst = n
		seen++
	}
	if seen != 2 || p.Last <= p.First {
		return partition{}, fmt.Errorf("sgdisk: no partition range in %q", out)
	}
	return p, nil
}

// espFile is one file copied onto the ESP (Dst in mtools ::/path form).
type espFile struct{ Src, Dst string }

// assembleDisk creates raw (sizeMiB, sparse) with a GPT holding one EFI
// system partition, builds a FAT32 file system with files in work/esp.img
// and writes it into the partition, keeping zeros as holes.
func assembleDisk(ctx context.Context, r Runner, work, raw string, sizeMiB int64, files []espFile) (partition, error) {
	if err := truncateNew(raw, sizeMiB*mib); err != nil {
		return partition{}, err
	}
	// Not -q: with it sgdisk silently creates nothing.
	if _, err := r.Run(ctx, Cmd{Name: "sgdisk", Args: []string{"-o", "-n", "1:2048:0", "-t", "1:ef00", "-c", "1:EFI system partition", raw}}); err != nil {
		return partition{}, fmt.Errorf("partition %s: %w", raw, err)
	}
	out, err := r.Run(ctx, Cmd{Name: "sgdisk", Args: []string{"-i", "1", raw}})
	if err != nil {
		return partition{}, fmt.Errorf("read partition 1 of %s: %w", raw, err)
	}
	p, err := parseSgdiskInfo(string(out))
	if err != nil {
		return partition{}, fmt.Errorf("partition 1 of %s: %w", raw, err)
	}
	esp := filepath.Join(work, "esp.img")
	if err := truncateNew(esp, (p.Last-p.First+1)*sectorSize); err != nil {
		return partition{}, err
	}
	cmds := []Cmd{{Name: "mkfs.vfat", Args: []string{"-F", "32", "-n", "GPUAAS-ESP", esp}}}
	dirs := map[string]bool{}
	var mkdirs []string
	for _, f := range files {
		for d := dirOf(f.Dst); d != "::" && !dirs[d]; d = dirOf(d) {
			dirs[d] = true
			mkdirs = append([]string{d}, mkdirs...)
		}
	}
	if len(mkdirs) > 0 {
		sortByDepth(mkdirs)
		cmds = append(cmds, Cmd{Name: "mmd", Args: append([]string{"-i", esp}, mkdirs...)})
	}
	for _, f := range files {
		cmds = append(cmds, Cmd{Name: "mcopy", Args: []string{"-i", esp, f.Src, f.Dst}})
	}
	cmds = append(cmds, Cmd{Name: "dd", Args: []string{
		"if=" + esp, "of=" + raw, "bs=1M", "oflag=seek_bytes",
		"seek=" + strconv.FormatInt(p.First*sectorSize, 10), "conv=notrunc,sparse", "status=none"}})
	for _, c := range cmds {
		if _, err := r.Run(ctx, c); err != nil {
			return partition{}, fmt.Errorf("build EFI system partition: %w", err)
		}
	}
	return p, nil
}

// dirOf is the parent of an mtools path ("::/a/b" -> "::/a", "::/a" -> "::").
func dirOf(p string) string {
	i := strings.LastIndex(p, "/")
	if i <= len("::") {
		return "::"
	}
	return p[:i]
}

func sortByDepth(ds []string) {
	// parents (fewer slashes) first, then by name
	slices.SortFunc(ds, func(a, b string) int {
		if c := cmp.Compare(strings.Count(a, "/"), strings.Count(b, "/")); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
}

// truncateNew creates path as a sparse file of size bytes.
func truncateNew(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return fmt.Errorf("size %s to %d bytes: %w", path, size, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	return nil
}
