package apprun

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzOpenLayout feeds arbitrary archives to the layout reader (outside
// input: an app's image). It must never panic, and whatever it accepts
// must unpack without writing outside the root.
func FuzzOpenLayout(f *testing.F) {
	for _, files := range [][]layoutFile{
		{{name: "app", data: "x"}},
		{{name: "d/", typ: tar.TypeDir, mode: 0o755}, {name: "d/.wh..wh..opq"}, {name: ".wh.x"}, {name: "l", typ: tar.TypeSymlink, link: "/"}},
	} {
		f.Add(seedLayout(f, files))
	}
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		p := filepath.Join(dir, "layout.tar")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		img, err := OpenLayout(p, filepath.Join(dir, "layout"), "sha256:"+hex.EncodeToString(sum[:]))
		if err != nil {
			return
		}
		root := filepath.Join(dir, "jail", "rootfs")
		_ = img.Unpack(root)
		ents, err := os.ReadDir(filepath.Join(dir, "jail"))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.Name() != "rootfs" {
				t.Fatalf("unpack wrote %s outside the root", e.Name())
			}
		}
		top, _ := os.ReadDir(dir)
		for _, e := range top {
			if !strings.HasPrefix(e.Name(), "layout") && e.Name() != "jail" {
				t.Fatalf("unpack wrote %s outside the root", e.Name())
			}
		}
	})
}

// seedLayout is a valid layout archive's bytes, a fuzz seed.
func seedLayout(f *testing.F, files []layoutFile) []byte {
	p, _ := testLayout(f, [][]byte{tarBytes(f, files)}, nil)
	b, err := os.ReadFile(p)
	if err != nil {
		f.Fatal(err)
	}
	return b
}
