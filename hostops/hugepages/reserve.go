package hugepages

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strconv"

	"github.com/gpuaas/gpuaas/hostops"
)

// Writer writes one value into a kernel tunable (a sysfs or procfs file).
// The real one is KernelWriter; tests use a fake that records a transcript
// and models what the kernel gives.
type Writer interface {
	WriteValue(path, value string) error
}

// KernelWriter writes to existing files only: a kernel tunable that does
// not exist is an error, never a new file.
type KernelWriter struct{}

// WriteValue writes value to the existing file at path.
func (KernelWriter) WriteValue(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(value); err != nil {
		f.Close()
		return fmt.Errorf("write %q to %s: %w", value, path, err)
	}
	return f.Close()
}

// Host resizes the hugepage pools of the host at Root through W.
type Host struct {
	Root hostops.Root
	W    Writer
}

// Reserve makes the pool of size on node (AnyNode: system-wide) hold at
// least count persistent pages, on the running host's root. See
// Host.Reserve.
func Reserve(root hostops.Root, node int, size PageSize, count uint64) error {
	return Host{Root: root, W: KernelWriter{}}.Reserve(node, size, count)
}

// Release shrinks the pool of size on node to at most count persistent
// pages. See Host.Release.
func Release(root hostops.Root, node int, size PageSize, count uint64) error {
	return Host{Root: root, W: KernelWriter{}}.Release(node, size, count)
}

// ResizeError says the kernel did not size a pool as asked (typically: not
// enough contiguous free memory for more pages). Prev is what the pool held
// before; Restored says whether it was put back.
type ResizeError struct {
	Node     int
	Size     PageSize
	Asked    uint64
	Got      uint64
	Prev     uint64
	Restored bool
}

func (e *ResizeError) Error() string {
	s := fmt.Sprintf("%s gave %d of %d requested %s hugepages (%s; had %d",
		nodeName(e.Node), e.Got, e.Asked, e.Size, humanBytes(e.Asked*e.Size.Bytes()), e.Prev)
	if e.Restored {
		return s + ", restored)"
	}
	return s + ", NOT restored)"
}

// Reserve makes the pool hold at least count persistent pages. It is
// absolute and idempotent: a pool that already holds count pages is left
// alone (never shrunk). It writes nr_hugepages, reads back what the kernel
// actually gave and, when that is less, restores the previous size and
// returns a *ResizeError with the numbers.
func (h Host) Reserve(node int, size PageSize, count uint64) error {
	nr, err := h.nrPath(node, size, count)
	if err != nil {
		return fmt.Errorf("reserve hugepages: %w", err)
	}
	prev, err := h.persistent(node, size)
	if err != nil {
		return fmt.Errorf("reserve %s hugepages on %s: %w", size, nodeName(node), err)
	}
	if prev >= count {
		return nil
	}
	got, err := h.set(nr, node, size, count)
	if err != nil {
		return fmt.Errorf("reserve %d %s hugepages on %s: %w", count, size, nodeName(node), err)
	}
	if got >= count {
		slog.Info("hugepage pool grown", "node", node, "size", size.String(), "from", prev, "to", got)
		return nil
	}
	rerr := &ResizeError{Node: node, Size: size, Asked: count, Got: got, Prev: prev}
	back, err := h.set(nr, node, size, prev)
	if err != nil {
		return errors.Join(rerr, fmt.Errorf("restore %s hugepages on %s to %d: %w", size, nodeName(node), prev, err))
	}
	rerr.Restored = back == prev
	return rerr
}

// Release shrinks the pool to at most count persistent pages (never grows
// it). Pages still mapped by a VM stay allocated as surplus until freed.
func (h Host) Release(node int, size PageSize, count uint64) error {
	nr, err := h.nrPath(node, size, count)
	if err != nil {
		return fmt.Errorf("release hugepages: %w", err)
	}
	prev, err := h.persistent(node, size)
	if err != nil {
		return fmt.Errorf("release %s hugepages on %s: %w", size, nodeName(node), err)
	}
	if prev <= count {
		return nil
	}
	got, err := h.set(nr, node, size, count)
	if err != nil {
		return fmt.Errorf("release %s hugepages on %s to %d: %w", size, nodeName(node), count, err)
	}
	if got != count {
		return &ResizeError{Node: node, Size: size, Asked: count, Got: got, Prev: prev}
	}
	slog.Info("hugepage pool shrunk", "node", node, "size", size.String(), "from", prev, "to", got)
	return nil
}

// set writes count to nr and returns the persistent size read back.
func (h Host) set(nr string, node int, size PageSize, count uint64) (uint64, error) {
	if err := h.W.WriteValue(nr, strconv.FormatUint(count, 10)); err != nil {
		return 0, err
	}
	return h.persistent(node, size)
}

// nrPath returns the nr_hugepages file of a pool after checking the
// arguments and that the pool exists.
func (h Host) nrPath(node int, size PageSize, count uint64) (string, error) {
	switch {
	case node < AnyNode:
		return "", fmt.Errorf("NUMA node %d is not a node number", node)
	case size == 0:
		return "", fmt.Errorf("page size is 0")
	case count > maxPages:
		return "", fmt.Errorf("%d pages is implausibly many", count)
	}
	if node == AnyNode {
		def, err := h.defaultSize()
		if err != nil {
			return "", err
		}
		if size == def {
			return h.Root.ProcPath("sys", "vm", "nr_hugepages"), nil
		}
	}
	dir := h.poolDir(node, size)
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%s has no %s hugepage pool (no %s)", nodeName(node), size, dir)
		}
		return "", err
	}
	return dir + "/nr_hugepages", nil
}

func (h Host) poolDir(node int, size PageSize) string {
	name := "hugepages-" + size.String()
	if node == AnyNode {
		return h.Root.SysPath("kernel", "mm", "hugepages", name)
	}
	return h.Root.SysPath("devices", "system", "node", "node"+strconv.Itoa(node), "hugepages", name)
}

func (h Host) defaultSize() (PageSize, error) {
	b, err := os.ReadFile(h.Root.ProcPath("meminfo"))
	if err != nil {
		return 0, err
	}
	m, err := parseMeminfo(string(b))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", h.Root.ProcPath("meminfo"), err)
	}
	return m.PageSize, nil
}

// persistent reads the pool's persistent page count: vm.nr_hugepages for
// the default size system-wide, else nr_hugepages minus surplus.
func (h Host) persistent(node int, size PageSize) (uint64, error) {
	if node == AnyNode {
		def, err := h.defaultSize()
		if err != nil {
			return 0, err
		}
		if size == def {
			return readCount(h.Root.ProcPath("sys", "vm", "nr_hugepages"))
		}
	}
	p, err := readPool(h.poolDir(node, size), size, false)
	if err != nil {
		return 0, err
	}
	return p.Persistent(), nil
}
