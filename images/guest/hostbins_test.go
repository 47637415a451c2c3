package guest

import (
	"bytes"
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/u-root/u-root/pkg/cpio"
)

// TestHostBinaries resolves crun's and tar's libraries from their ELF
// headers and packs them: the loader and libc are among them, and the
// archive holds each file with its content.
func TestHostBinaries(t *testing.T) {
	for _, b := range HostBinaries {
		if _, err := os.Stat(b); err != nil {
			t.Skipf("%s not installed (make deps)", b)
		}
	}
	files, err := resolveHostBinaries(HostBinaries)
	require.NoError(t, err)
	var dsts []string
	for _, f := range files {
		dsts = append(dsts, f.Dst)
	}
	require.Contains(t, dsts, "/usr/bin/crun")
	require.Contains(t, dsts, "/usr/bin/tar")
	require.Contains(t, dsts, "/lib64/ld-linux-x86-64.so.2")
	require.Contains(t, dsts, "/lib/x86_64-linux-gnu/libc.so.6")
	require.Contains(t, dsts, "/lib/x86_64-linux-gnu/libseccomp.so.2")

	b, err := hostBinariesCPIO(files)
	require.NoError(t, err)
	r := cpio.Newc.Reader(bytes.NewReader(b))
	recs, err := cpio.ReadAllRecords(r)
	require.NoError(t, err)
	got := map[string]cpio.Record{}
	for _, rec := range recs {
		got[rec.Name] = rec
	}
	crun, ok := got["usr/bin/crun"]
	require.True(t, ok)
	content, err := io.ReadAll(io.NewSectionReader(crun.ReaderAt, 0, int64(crun.FileSize)))
	require.NoError(t, err)
	want, err := os.ReadFile("/usr/bin/crun")
	require.NoError(t, err)
	require.Equal(t, want, content)
	require.Contains(t, got, "lib64")

	_, err = resolveHostBinaries([]string{"/nonexistent/crun"})
	require.ErrorContains(t, err, "make deps installs it")
}
