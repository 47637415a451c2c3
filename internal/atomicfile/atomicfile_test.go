package atomicfile

import (
	"bufio"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// entries lists dir's file names.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func requireFile(t *testing.T, path, content string, mode fs.FileMode) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, content, string(b))
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, mode, fi.Mode().Perm(), "mode of %s", path)
}

func TestWriteFile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		old     string // "" = no file yet
		oldMode fs.FileMode
		content string
		perm    fs.FileMode
	}{
		{name: "new secret", content: "new\n", perm: 0o600},
		{name: "new world-readable", content: "new\n", perm: 0o644},
		{name: "new group-writable (no umask)", content: "new\n", perm: 0o664},
		{name: "replace", old: "old content that is longer\n", oldMode: 0o600, content: "new\n", perm: 0o600},
		{name: "replace restores the mode", old: "old\n", oldMode: 0o644, content: "new\n", perm: 0o600},
		{name: "replace with empty", old: "old\n", oldMode: 0o644, content: "", perm: 0o644},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "credential")
			if tc.old != "" {
				require.NoError(t, os.WriteFile(path, []byte(tc.old), tc.oldMode))
				require.NoError(t, os.Chmod(path, tc.oldMode))
			}
			require.NoError(t, WriteFile(path, []byte(tc.content), tc.perm))
			requireFile(t, path, tc.content, tc.perm)
			require.Equal(t, []string{"credential"}, entries(t, dir), "no temporary file is left")
		})
	}
}

func TestWriteFileRelativePath(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	require.NoError(t, WriteFile("state.json", []byte("{}\n"), 0o644))
	requireFile(t, filepath.Join(dir, "state.json"), "{}\n", 0o644)
}

func TestWriteFileBadPathChangesNothing(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "sub")
	require.NoError(t, os.Mkdir(sub, 0o755))

	err := WriteFile(filepath.Join(dir, "missing", "f"), []byte("x"), 0o600)
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorContains(t, err, filepath.Join(dir, "missing", "f"))

	// A directory at the path is not replaced.
	err = WriteFile(sub, []byte("x"), 0o600)
	require.Error(t, err)
	require.ErrorContains(t, err, sub)
	fi, err := os.Stat(sub)
	require.NoError(t, err)
	require.True(t, fi.IsDir())
	require.Equal(t, []string{"sub"}, entries(t, dir))

	require.ErrorContains(t, WriteFile(dir+"/", []byte("x"), 0o600), "no file name")
}

// A crash after the new content is written and synced but before the
// rename leaves the old content (simulated by failing at that point).
func TestFailureBeforeRenameKeepsOldContent(t *testing.T) {
	crash := errors.New("simulated crash")
	beforeCommit = func(tmp string) error {
		b, err := os.ReadFile(tmp)
		require.NoError(t, err)
		require.Equal(t, "new\n", string(b), "the temporary file is complete before the rename")
		return crash
	}
	t.Cleanup(func() { beforeCommit = nil })

	dir := t.TempDir()
	path := filepath.Join(dir, "tokens.json")
	require.NoError(t, os.WriteFile(path, []byte("old\n"), 0o600))
	require.ErrorIs(t, WriteFile(path, []byte("new\n"), 0o600), crash)
	requireFile(t, path, "old\n", 0o600)
	require.Equal(t, []string{"tokens.json"}, entries(t, dir), "the temporary file is removed")

	// Without an old file there is no file at all, not an empty one.
	fresh := filepath.Join(dir, "site.key")
	require.ErrorIs(t, Create(fresh, []byte("new\n"), 0o600), crash)
	require.NoFileExists(t, fresh)
	require.Equal(t, []string{"tokens.json"}, entries(t, dir))
}

// A process killed (SIGKILL) just before the rename leaves the old content:
// a child process writes and blocks there; the test kills it.
func TestKilledBeforeRenameKeepsOldContent(t *testing.T) {
	if path := os.Getenv("ATOMICFILE_TEST_CHILD"); path != "" {
		beforeCommit = func(string) error {
			os.Stdout.WriteString("before rename\n")
			time.Sleep(time.Minute) // killed here
			return errors.New("not killed")
		}
		_ = WriteFile(path, []byte("new content\n"), 0o600)
		os.Exit(3)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "credential")
	require.NoError(t, os.WriteFile(path, []byte("old content\n"), 0o600))

	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledBeforeRenameKeepsOldContent$")
	cmd.Env = append(os.Environ(), "ATOMICFILE_TEST_CHILD="+path)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "before rename\n", line)
	require.NoError(t, cmd.Process.Kill())
	require.Error(t, cmd.Wait())

	requireFile(t, path, "old content\n", 0o600)
	// What the crash leaves: the old file and a complete temporary one.
	names := entries(t, dir)
	require.Len(t, names, 2)
	matched, err := filepath.Match(".credential.tmp-*", names[0])
	require.NoError(t, err)
	require.True(t, matched, "stray temporary file %q", names[0])
	b, err := os.ReadFile(filepath.Join(dir, names[0]))
	require.NoError(t, err)
	require.Equal(t, "new content\n", string(b))

	// The next write succeeds over it.
	require.NoError(t, WriteFile(path, []byte("new content\n"), 0o600))
	requireFile(t, path, "new content\n", 0o600)
}

func TestCreate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "site.key")
	require.NoError(t, Create(path, []byte("first\n"), 0o600))
	requireFile(t, path, "first\n", 0o600)

	err := Create(path, []byte("second\n"), 0o644)
	require.ErrorIs(t, err, fs.ErrExist)
	require.ErrorContains(t, err, path)
	requireFile(t, path, "first\n", 0o600)
	require.Equal(t, []string{"site.key"}, entries(t, dir), "no temporary file is left")
}

func TestCreateRaceHasOneWinner(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "admin.token")
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = Create(path, []byte{byte('a' + i)}, 0o600) })
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		if err == nil {
			require.Equal(t, -1, winner, "two Creates succeeded")
			winner = i
			continue
		}
		require.ErrorIs(t, err, fs.ErrExist)
	}
	require.NotEqual(t, -1, winner, "no Create succeeded")
	requireFile(t, path, string([]byte{byte('a' + winner)}), 0o600)
	require.Equal(t, []string{"admin.token"}, entries(t, dir))
}
