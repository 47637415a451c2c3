// Package atomicfile writes files that must survive a crash: after a crash
// or power loss at any point, the path holds either its old content or the
// new, never a truncated or partly written file.
//
// The content goes to a temporary file in the same directory (so the rename
// cannot cross filesystems), which is given its mode, fsynced and renamed
// over the path; the directory is then fsynced so the rename itself is on
// disk. A crash before the rename leaves the old file and at most a stray
// "."+name+".tmp-*" file next to it.
//
// It sits below every other package of the module (it imports only the
// standard library), so the agent, the coordinator, hostops and the lab all
// use it.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// beforeCommit, when set (by tests), runs after the temporary file is
// complete and synced and before it replaces the path; an error from it
// stands for a crash at that point.
var beforeCommit func(tmp string) error

// WriteFile writes data to path atomically and durably. The file ends up
// with mode perm (the umask is not applied) whether or not it existed:
// unlike os.WriteFile, a rewrite also restores a mode changed by hand, so a
// secret written 0600 stays 0600. The directory must exist. A symbolic link
// at path is replaced, not followed.
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	if err := commit(path, data, perm, os.Rename); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Create writes data to path atomically and durably like WriteFile, but
// only if path does not exist yet: otherwise it changes nothing and returns
// an error that matches fs.ErrExist. Two racing Creates never both succeed,
// and a crash never leaves a partial file that would block the next try.
func Create(path string, data []byte, perm fs.FileMode) error {
	link := func(tmp, path string) error {
		if err := os.Link(tmp, path); err != nil {
			return err
		}
		// The file is in place; a temporary name left behind is as
		// harmless as one a crash leaves.
		_ = os.Remove(tmp)
		return nil
	}
	if err := commit(path, data, perm, link); err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	return nil
}

// commit writes data to a synced temporary file next to path, moves it into
// place with place, and syncs the directory.
func commit(path string, data []byte, perm fs.FileMode, place func(tmp, path string) error) (err error) {
	dir, name := filepath.Split(path)
	if name == "" {
		return errors.New("no file name")
	}
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return err
	}
	placed := false
	defer func() {
		if !placed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if beforeCommit != nil {
		if err := beforeCommit(tmp.Name()); err != nil {
			return err
		}
	}
	if err := place(tmp.Name(), path); err != nil {
		return err
	}
	placed = true
	return syncDir(dir)
}

// syncDir makes a rename or link in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return d.Close()
}
