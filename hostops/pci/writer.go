package pci

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/gpuaas/gpuaas/hostops"
)

// Writer writes one sysfs attribute. rel is relative to the sysfs root
// ("bus/pci/devices/0000:18:00.0/driver_override"); value is written in one
// write(2), as the kernel expects. On a real host the kernel reacts to the
// write (binds a driver, creates VFs); lab/hostsim.Kernel implements the same
// reactions on a simulated tree, so code written against Writer runs
// unchanged on both.
type Writer interface {
	WriteSysfs(rel, value string) error
}

// SysfsWriter is the real Writer: it writes files under Root.Sys.
type SysfsWriter struct {
	Root hostops.Root
}

// WriteSysfs opens the existing attribute and writes value. It never creates
// files: sysfs attributes exist or the operation is unsupported.
func (w SysfsWriter) WriteSysfs(rel, value string) error {
	if !filepath.IsLocal(rel) {
		return fmt.Errorf("write sysfs %q: not a path below the sysfs root", rel)
	}
	p := w.Root.SysPath(rel)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return fmt.Errorf("write sysfs %s: %w", rel, err)
	}
	_, werr := f.WriteString(value)
	cerr := f.Close()
	if werr != nil {
		return fmt.Errorf("write %q to sysfs %s: %w", value, rel, werr)
	}
	if cerr != nil {
		return fmt.Errorf("write %q to sysfs %s: %w", value, rel, cerr)
	}
	return nil
}

// Write is one recorded sysfs write.
type Write struct {
	Path  string // relative to the sysfs root
	Value string
	Err   string `json:",omitempty"` // error text when the write failed
}

// Recorder is a Writer that records every write into a transcript and
// forwards it to Next (nil: record only and succeed). Tests compare the
// transcript with the writes they expect; the agent can log it.
type Recorder struct {
	Next Writer

	mu     sync.Mutex
	writes []Write
}

// WriteSysfs records the write and forwards it.
func (r *Recorder) WriteSysfs(rel, value string) error {
	var err error
	if r.Next != nil {
		err = r.Next.WriteSysfs(rel, value)
	}
	w := Write{Path: rel, Value: value}
	if err != nil {
		w.Err = err.Error()
	}
	r.mu.Lock()
	r.writes = append(r.writes, w)
	r.mu.Unlock()
	return err
}

// Writes returns a copy of the transcript so far.
func (r *Recorder) Writes() []Write {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.writes)
}

// Reset clears the transcript.
func (r *Recorder) Reset() {
	r.mu.Lock()
	r.writes = nil
	r.mu.Unlock()
}
