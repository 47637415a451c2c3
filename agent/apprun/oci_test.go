package apprun

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// layoutFile is one tar entry of a test layer or layout.
type layoutFile struct {
	name, link string
	typ        byte
	mode       int64
	data       string
}

func tarBytes(t testing.TB, files []layoutFile) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		typ := f.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := f.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: f.name, Linkname: f.link, Typeflag: typ, Mode: mode, Size: int64(len(f.data))}
		if typ != tar.TypeReg {
			h.Size = 0
		}
		require.NoError(t, tw.WriteHeader(h))
		if typ == tar.TypeReg {
			_, err := tw.Write([]byte(f.data))
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	return buf.Bytes()
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// testLayout writes a layout archive with the given uncompressed layers;
// mutate may change the documents before they are written.
func testLayout(t testing.TB, layers [][]byte, mutate func(*ImageConfig, *Manifest)) (string, string) {
	t.Helper()
	cfg := ImageConfig{Architecture: "amd64", OS: "linux", RootFS: RootFS{Type: "layers"},
		Config: ContainerConfig{Entrypoint: []string{"/app"}, User: "1000:1000"}}
	man := Manifest{SchemaVersion: 2, MediaType: MediaTypeManifest}
	blobs := map[string][]byte{}
	for _, l := range layers {
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, sha(l))
		man.Layers = append(man.Layers, Descriptor{MediaType: MediaTypeLayer, Digest: sha(l), Size: int64(len(l))})
		blobs[sha(l)] = l
	}
	if mutate != nil {
		mutate(&cfg, &man)
	}
	cb, _ := json.Marshal(cfg)
	blobs[sha(cb)] = cb
	man.Config = Descriptor{MediaType: MediaTypeConfig, Digest: sha(cb), Size: int64(len(cb))}
	mb, _ := json.Marshal(man)
	blobs[sha(mb)] = mb
	ib, _ := json.Marshal(Index{SchemaVersion: 2, Manifests: []Descriptor{{MediaType: MediaTypeManifest, Digest: sha(mb), Size: int64(len(mb))}}})
	files := []layoutFile{{name: "oci-layout", data: `{"imageLayoutVersion":"1.0.0"}`}, {name: "index.json", data: string(ib)}}
	for d, b := range blobs {
		files = append(files, layoutFile{name: "blobs/sha256/" + strings.TrimPrefix(d, "sha256:"), data: string(b)})
	}
	p := filepath.Join(t.TempDir(), "layout.tar")
	require.NoError(t, os.WriteFile(p, tarBytes(t, files), 0o644))
	return p, sha(mb)
}

func TestOpenLayoutAndUnpack(t *testing.T) {
	l1 := tarBytes(t, []layoutFile{
		{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/passwd", data: "root:x:0:0::/:/bin/sh\n"},
		{name: "app", mode: 0o755, data: "#!/bin/true\n"},
		{name: "old/", typ: tar.TypeDir, mode: 0o755},
		{name: "old/a", data: "a"},
		{name: "keep/", typ: tar.TypeDir, mode: 0o755},
		{name: "keep/x", data: "x"},
		{name: "lnk", typ: tar.TypeSymlink, link: "/app"},
	})
	l2 := tarBytes(t, []layoutFile{
		{name: ".wh.old"},
		{name: "keep/.wh..wh..opq"},
		{name: "keep/y", data: "y"},
		{name: "hard", typ: tar.TypeLink, link: "app"},
		{name: "app", mode: 0o700, data: "v2"},
	})
	p, digest := testLayout(t, [][]byte{l1, l2}, nil)
	img, err := OpenLayout(p, filepath.Join(t.TempDir(), "layout"), digest)
	require.NoError(t, err)
	require.Equal(t, digest, img.Digest)
	root := filepath.Join(t.TempDir(), "rootfs")
	require.NoError(t, img.Unpack(root))
	b, err := os.ReadFile(filepath.Join(root, "app"))
	require.NoError(t, err)
	require.Equal(t, "v2", string(b))
	st, err := os.Stat(filepath.Join(root, "app"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	require.NoDirExists(t, filepath.Join(root, "old"))
	require.NoFileExists(t, filepath.Join(root, "keep", "x"))
	require.FileExists(t, filepath.Join(root, "keep", "y"))
	link, err := os.Readlink(filepath.Join(root, "lnk"))
	require.NoError(t, err)
	require.Equal(t, "/app", link, "symlinks are kept as written, not resolved on the host")
}

// TestOpenLayoutByArchiveDigest: a layout named by the sha256 of its
// archive (a blob store's key) opens the one image its index names.
func TestOpenLayoutByArchiveDigest(t *testing.T) {
	p, digest := testLayout(t, [][]byte{tarBytes(t, []layoutFile{{name: "app", data: "x"}})}, nil)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	img, err := OpenLayout(p, filepath.Join(t.TempDir(), "layout"), sha(b))
	require.NoError(t, err)
	require.Equal(t, digest, img.Digest)
}

func TestOpenLayoutRefuses(t *testing.T) {
	good := tarBytes(t, []layoutFile{{name: "app", data: "x"}})
	for name, tc := range map[string]struct {
		layers [][]byte
		mutate func(*ImageConfig, *Manifest)
		want   string // "" = the digest is wrong
		err    string
	}{
		"another image": {layers: [][]byte{good}, want: "sha256:" + strings.Repeat("0", 64), err: "names no manifest"},
		"wrong arch": {layers: [][]byte{good}, mutate: func(c *ImageConfig, _ *Manifest) { c.Architecture = "arm64" },
			err: "linux/arm64"},
		"diff id count": {layers: [][]byte{good}, mutate: func(c *ImageConfig, _ *Manifest) { c.RootFS.DiffIDs = nil },
			err: "0 diff_ids for 1 layers"},
		"zstd layer": {layers: [][]byte{good}, mutate: func(_ *ImageConfig, m *Manifest) {
			m.Layers[0].MediaType = "application/vnd.oci.image.layer.v1.tar+zstd"
		}, err: "not supported"},
		"size lie": {layers: [][]byte{good}, mutate: func(_ *ImageConfig, m *Manifest) { m.Layers[0].Size++ },
			err: "descriptor says"},
	} {
		t.Run(name, func(t *testing.T) {
			p, digest := testLayout(t, tc.layers, tc.mutate)
			if tc.want != "" {
				digest = tc.want
			}
			_, err := OpenLayout(p, filepath.Join(t.TempDir(), "layout"), digest)
			require.ErrorContains(t, err, tc.err)
		})
	}
}

func TestOpenLayoutRefusesTamperedBlob(t *testing.T) {
	layer := tarBytes(t, []layoutFile{{name: "app", data: "x"}})
	p, digest := testLayout(t, [][]byte{layer}, nil)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	i := bytes.Index(b, layer)
	require.Positive(t, i)
	b[i+600] ^= 0xff // inside the layer's "app" content block
	require.NoError(t, os.WriteFile(p, b, 0o644))
	_, err = OpenLayout(p, filepath.Join(t.TempDir(), "layout"), digest)
	require.ErrorContains(t, err, "corrupt or tampered")
}

func TestUnpackRefusesEscapes(t *testing.T) {
	for name, files := range map[string][]layoutFile{
		"dotdot":          {{name: "../../etc/evil", data: "x"}},
		"through symlink": {{name: "esc", typ: tar.TypeSymlink, link: "/"}, {name: "esc/etc/evil", data: "x"}},
		"hard link out":   {{name: "h", typ: tar.TypeLink, link: "../../etc/passwd"}},
	} {
		t.Run(name, func(t *testing.T) {
			p, digest := testLayout(t, [][]byte{tarBytes(t, files)}, nil)
			img, err := OpenLayout(p, filepath.Join(t.TempDir(), "layout"), digest)
			require.NoError(t, err)
			base := t.TempDir()
			err = img.Unpack(filepath.Join(base, "a", "rootfs"))
			if name == "dotdot" {
				// Cleaned to /etc/evil inside the root, never outside it.
				require.NoError(t, err)
				require.FileExists(t, filepath.Join(base, "a", "rootfs", "etc", "evil"))
				require.NoFileExists(t, filepath.Join(base, "etc", "evil"))
				return
			}
			require.Error(t, err)
		})
	}
}

func TestRuntimeConfig(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0::/:/bin/sh\njovyan:x:1000:100::/home/jovyan:/bin/bash\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "etc", "group"), []byte("root:x:0:\nusers:x:100:\n"), 0o644))
	s := Spec{InstanceID: "Inst_1", AllocationID: "a1", Env: map[string]string{"B": "2", "A": "1", "PORT": "9"}}
	s.App.Image = "x/y@sha256:" + strings.Repeat("a", 64)
	ic := ImageConfig{Config: ContainerConfig{Entrypoint: []string{"/bin/app"}, Cmd: []string{"--x"}, User: "jovyan", Env: []string{"PORT=8080", "PATH=/opt/bin"}}}
	rs, err := runtimeConfig(s, ic, root, bundleOptions{NetNS: "/run/netns/x"})
	require.NoError(t, err)
	require.Equal(t, []string{"/bin/app", "--x"}, rs.Process.Args)
	require.Equal(t, rtUser{UID: 1000, GID: 100}, rs.Process.User)
	require.Equal(t, []string{"PATH=/opt/bin", "PORT=9", "A=1", "B=2", "GPUAAS_INSTANCE=Inst_1", "GPUAAS_ALLOCATION=a1"}, rs.Process.Env)
	require.Equal(t, "inst-1", rs.Hostname)
	require.Contains(t, rs.Linux.Namespaces, rtNamespace{Type: "network", Path: "/run/netns/x"})

	rs, err = runtimeConfig(s, ic, root, bundleOptions{})
	require.NoError(t, err)
	for _, n := range rs.Linux.Namespaces {
		require.NotEqual(t, "network", n.Type, "no network namespace: the app's ports are on the guest's address")
	}
	for _, tc := range []struct{ user, err string }{
		{"nobody", "not in the image's /etc/passwd"}, {"1000:wheel", "not in the image's /etc/group"},
	} {
		ic.Config.User = tc.user
		_, err = runtimeConfig(s, ic, root, bundleOptions{})
		require.ErrorContains(t, err, tc.err)
	}
	ic.Config.User = "0"
	s.Env = map[string]string{"BAD-NAME": "x"}
	_, err = runtimeConfig(s, ic, root, bundleOptions{})
	require.ErrorContains(t, err, `"BAD-NAME"`)
	ic.Config.Entrypoint, ic.Config.Cmd = nil, nil
	s.Env = nil
	_, err = runtimeConfig(s, ic, root, bundleOptions{})
	require.ErrorContains(t, err, "neither Entrypoint nor Cmd")
}
