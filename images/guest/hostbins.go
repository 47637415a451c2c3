package guest

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/u-root/u-root/pkg/cpio"
)

// HostBinaries are the Debian programs the guest carries besides u-root's
// Go commands, copied from this machine with the shared libraries they
// load: the OCI runtime the agent's app runner starts launchables with
// (agent/apprun), and GNU tar, which unpacks an app's bundle (u-root's tar
// has no -C and keeps no owners). Both are at the paths a Debian or Ubuntu
// slice image has them, so the runner's commands are the same in the lab
// guest and in production.
var HostBinaries = []string{"/usr/bin/crun", "/usr/bin/tar"}

// hostFile is one file of the host-binaries archive: Src on this machine,
// Dst in the guest.
type hostFile struct{ Src, Dst string }

// libDirs are where resolveHostBinaries looks for a DT_NEEDED library
// (Debian's multiarch directories, as the dynamic loader searches them).
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib"}

// resolveHostBinaries lists bins and, read from their ELF headers, the
// dynamic loader (PT_INTERP) and every shared library they need
// (DT_NEEDED, transitively), each once, sorted by destination. It runs no
// program (the build's inputs are resolved before anything runs).
func resolveHostBinaries(bins []string) ([]hostFile, error) {
	seen := map[string]bool{}
	var out []hostFile
	var walk func(p string, top bool) error
	walk = func(p string, top bool) error {
		if seen[p] {
			return nil
		}
		seen[p] = true
		out = append(out, hostFile{Src: p, Dst: p})
		f, err := elf.Open(p)
		if err != nil {
			return fmt.Errorf("guest host binary %s: %w", p, err)
		}
		defer f.Close()
		if top {
			for _, prog := range f.Progs {
				if prog.Type != elf.PT_INTERP {
					continue
				}
				b, err := io.ReadAll(prog.Open())
				if err != nil {
					return fmt.Errorf("guest host binary %s: interpreter: %w", p, err)
				}
				if err := walk(strings.TrimRight(string(b), "\x00"), false); err != nil {
					return err
				}
			}
		}
		needed, err := f.ImportedLibraries()
		if err != nil {
			return fmt.Errorf("guest host binary %s: %w", p, err)
		}
		for _, n := range needed {
			found := ""
			for _, d := range libDirs {
				if _, err := os.Stat(filepath.Join(d, n)); err == nil {
					found = filepath.Join(d, n)
					break
				}
			}
			if found == "" {
				return fmt.Errorf("guest host binary %s: library %s not found in %v", p, n, libDirs)
			}
			if err := walk(found, false); err != nil {
				return err
			}
		}
		return nil
	}
	for _, b := range bins {
		if _, err := os.Stat(b); err != nil {
			return nil, fmt.Errorf("guest host binary %s: %w (make deps installs it)", b, err)
		}
		if err := walk(b, true); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(out, func(a, b hostFile) int { return strings.Compare(a.Dst, b.Dst) })
	return out, nil
}

// hostBinariesCPIO is a newc archive of files (their content, symlinks
// resolved) with the directories above them.
func hostBinariesCPIO(files []hostFile) ([]byte, error) {
	var buf bytes.Buffer
	w := cpio.Newc.Writer(&buf)
	var recs []cpio.Record
	dirs := map[string]bool{}
	for _, f := range files {
		parts := strings.Split(strings.TrimPrefix(path.Dir(f.Dst), "/"), "/")
		for i := range parts {
			d := strings.Join(parts[:i+1], "/")
			if d != "" && !dirs[d] {
				dirs[d] = true
				recs = append(recs, cpio.Directory(d, 0o755))
			}
		}
		b, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, fmt.Errorf("guest host binaries: %w", err)
		}
		st, err := os.Stat(f.Src)
		if err != nil {
			return nil, fmt.Errorf("guest host binaries: %w", err)
		}
		recs = append(recs, cpio.StaticFile(strings.TrimPrefix(filepath.ToSlash(f.Dst), "/"), string(b), uint64(st.Mode().Perm())))
	}
	if err := cpio.WriteRecords(w, recs); err != nil {
		return nil, fmt.Errorf("write host binaries cpio: %w", err)
	}
	if err := cpio.WriteTrailer(w); err != nil {
		return nil, fmt.Errorf("write host binaries cpio trailer: %w", err)
	}
	return buf.Bytes(), nil
}
