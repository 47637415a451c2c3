package units

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// File observes the regular file at path, a path already resolved through
// a hostops.Root (root.EtcPath("netplan", "60-gpuaas-ipoib.yaml")). When
// check is not nil the content must also pass it; its error becomes the
// Down detail. Absent files and directories are Down; an error means the
// path is not absolute and clean, or the file could not be read.
func File(path string, check func(content []byte) error) (Evidence, error) {
	ev := Evidence{Subject: "file " + path}
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return ev, fmt.Errorf("probe file %q: want an absolute, clean path", path)
	}
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		ev.State, ev.Detail = Down, "absent"
		return ev, nil
	}
	if err != nil {
		return ev, fmt.Errorf("probe file %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		ev.State, ev.Detail = Down, "not a regular file ("+st.Mode().Type().String()+")"
		return ev, nil
	}
	ev.State, ev.Detail = Up, fmt.Sprintf("%d bytes, mode %04o", st.Size(), st.Mode().Perm())
	if check == nil {
		return ev, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ev, fmt.Errorf("probe file %s: %w", path, err)
	}
	if err := check(b); err != nil {
		ev.State, ev.Detail = Down, "content: "+err.Error()
	}
	return ev, nil
}
