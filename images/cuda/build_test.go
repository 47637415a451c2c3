package cuda

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mirror serves Ubuntu's release directory and NVIDIA's repository on
// loopback (TLS: the recipe takes https sources only).
type mirror struct {
	srv   *httptest.Server
	image []byte
	sums  string
	mu    sync.Mutex
	hits  []string
}

func newMirror(t *testing.T) *mirror {
	t.Helper()
	m := &mirror{image: []byte("QFI\xfb fake ubuntu qcow2")}
	sum := sha256.Sum256(m.image)
	m.sums = hex.EncodeToString(sum[:]) + " *" + UbuntuBase.File + "\n" + strings.Repeat("0", 64) + " *other.img\n"
	base := "/ubuntu/" + UbuntuBase.Codename + "/" + UbuntuBase.Serial + "/"
	mux := http.NewServeMux()
	serve := func(path string, body func() []byte) {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			m.mu.Lock()
			m.hits = append(m.hits, r.Method+" "+r.URL.Path)
			m.mu.Unlock()
			_, _ = w.Write(body())
		})
	}
	serve(base+"SHA256SUMS", func() []byte { return []byte(m.sums) })
	serve(base+"SHA256SUMS.gpg", func() []byte { return []byte("signature") })
	serve(base+UbuntuBase.File, func() []byte { return m.image })
	serve("/nvidia/InRelease", func() []byte { return []byte("Origin: NVIDIA") })
	serve("/nvidia/3bf863cc.pub", func() []byte { return []byte("key") })
	m.srv = httptest.NewTLSServer(mux)
	t.Cleanup(m.srv.Close)
	return m
}

// fakeRunner records commands; gpgv answers a valid signature by signer.
type fakeRunner struct {
	mu      sync.Mutex
	cmds    []string
	signer  string
	uploads map[string]string // guest path -> content at virt-customize time
}

func (f *fakeRunner) Run(_ context.Context, c Cmd) ([]byte, error) {
	f.mu.Lock()
	f.cmds = append(f.cmds, c.String())
	f.mu.Unlock()
	switch {
	case c.Name == "gpgv":
		if f.signer == "" {
			return []byte("[GNUPG:] BADSIG 1A5D6C4C7DB87C81 UEC Image Automatic Signing Key"), errors.New("gpgv: exit status 1")
		}
		return []byte("[GNUPG:] NEWSIG\n[GNUPG:] GOODSIG 1A5D6C4C7DB87C81 UEC Image Automatic Signing Key <cdimage@ubuntu.com>\n" +
			"[GNUPG:] VALIDSIG " + f.signer + " 2024-04-23 1713900000 0 4 0 1 10 00 " + f.signer + "\n"), nil
	case c.Name == "qemu-img" && c.Args[0] == "convert":
		return nil, os.WriteFile(c.Args[len(c.Args)-1], []byte("raw disk"), 0o644)
	case c.Name == "virt-customize":
		f.uploads = map[string]string{}
		for i, a := range c.Args {
			if a == "--upload" || a == "--run" {
				src, dst, _ := strings.Cut(c.Args[i+1], ":")
				b, err := os.ReadFile(src)
				if err != nil {
					return nil, err
				}
				if a == "--run" {
					dst = "RUN"
				}
				f.uploads[dst] = string(b)
			}
		}
	}
	return nil, nil
}

func buildOptions(t *testing.T, m *mirror, r Recipe, run *fakeRunner) Options {
	t.Helper()
	keyring := filepath.Join(t.TempDir(), "ubuntu-cloudimage-keyring.gpg")
	require.NoError(t, os.WriteFile(keyring, []byte("keyring"), 0o644))
	o := Options{Recipe: r, CacheRoot: filepath.Join(t.TempDir(), "cache"), BaseServer: m.srv.URL + "/ubuntu", BaseKeyring: keyring,
		HTTP: m.srv.Client(), Runner: run}
	if r.Repo != nil {
		o.RepoURL = m.srv.URL + "/nvidia/"
	}
	return o
}

// TestBuildTranscript builds the CUDA image from a loopback mirror with a
// recording runner: the base is verified against the signed SHA256SUMS,
// converted, grown and customised with the generated files, and the
// manifest lands next to the disk.
func TestBuildTranscript(t *testing.T) {
	t.Parallel()
	m := newMirror(t)
	run := &fakeRunner{signer: UbuntuBase.KeyFinger}
	o := buildOptions(t, m, CUDARecipe(), run)
	man, path, err := Build(context.Background(), o)
	require.NoError(t, err)
	r := CUDARecipe()
	require.Equal(t, filepath.Join(o.CacheRoot, r.Name, r.Version, "disk.raw"), path)
	baseDir := filepath.Join(o.CacheRoot, "ubuntu", "noble", UbuntuBase.Serial)
	img := filepath.Join(baseDir, UbuntuBase.File)
	require.Len(t, run.cmds, 4)
	work := strings.TrimSuffix(strings.Fields(run.cmds[1])[7], "/disk.raw")
	want := []string{
		"gpgv --status-fd 1 --keyring " + o.BaseKeyring + " " + baseDir + "/SHA256SUMS.gpg " + baseDir + "/SHA256SUMS",
		"qemu-img convert -f qcow2 -O raw " + img + " " + work + "/disk.raw",
		"qemu-img resize -f raw " + work + "/disk.raw 32G",
		"virt-customize -a " + work + "/disk.raw --format raw --network --run-command growpart /dev/sda 1 && resize2fs /dev/sda1" +
			" --mkdir /etc/cloud/cloud.cfg.d --upload " + work + "/99-gpuaas.cfg:/etc/cloud/cloud.cfg.d/99-gpuaas.cfg" +
			" --upload " + work + "/gpuaas-cuda.pref:/etc/apt/preferences.d/gpuaas-cuda" +
			" --upload " + work + "/cuda.list:/etc/apt/sources.list.d/cuda.list" +
			" --run " + work + "/customize.sh --upload " + work + "/marker:/boot/efi/gpuaas/marker",
	}
	if d := cmp.Diff(want, run.cmds); d != "" {
		t.Fatalf("transcript (-want +got):\n%s", d)
	}
	// Built through a mirror, the image keeps using it.
	mirrored := *r.Repo
	mirrored.URL = o.RepoURL
	r.Repo = &mirrored
	assert.Equal(t, r.CloudConfig(), run.uploads[CloudCfgPath])
	assert.Equal(t, r.AptPreferences(), run.uploads[AptPrefsPath])
	assert.Equal(t, "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "+o.RepoURL+" /\n", run.uploads[AptSourcePath])
	assert.Equal(t, r.Script(), run.uploads["RUN"])
	marker := run.uploads["/boot/efi/gpuaas/marker"]
	sum := sha256.Sum256([]byte(marker))
	assert.Equal(t, hex.EncodeToString(sum[:]), man.MarkerSHA256)

	disk := sha256.Sum256([]byte("raw disk"))
	assert.Equal(t, hex.EncodeToString(disk[:]), man.SHA256)
	assert.Equal(t, int64(len("raw disk")), man.Size)
	assert.Equal(t, KindCUDA, man.Kind)
	assert.Equal(t, "cuda", man.ReadinessCheck)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(path), "manifest.json"))
	require.NoError(t, err)
	var onDisk Manifest
	require.NoError(t, json.Unmarshal(b, &onDisk))
	assert.Equal(t, man, onDisk)
	ents, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, ents, 2, "only the disk and its manifest stay")

	// A second build reuses the verified base image: no download.
	m.hits = nil
	_, _, err = Build(context.Background(), o)
	require.NoError(t, err)
	assert.NotContains(t, m.hits, "GET /ubuntu/noble/"+UbuntuBase.Serial+"/"+UbuntuBase.File)
}

func TestBuildRefusesBadBase(t *testing.T) {
	t.Parallel()
	m := newMirror(t)
	run := &fakeRunner{signer: "0000000000000000000000000000000000000000"}
	o := buildOptions(t, m, BaseRecipe(), run)
	_, _, err := Build(context.Background(), o)
	assert.ErrorContains(t, err, `signed by "0000000000000000000000000000000000000000", pinned key is D2EB44626FDDC30B513D5BB71A5D6C4C7DB87C81`)
	run.signer = ""
	_, _, err = Build(context.Background(), o)
	assert.ErrorContains(t, err, "verify ")

	run.signer = UbuntuBase.KeyFinger
	m.image = []byte("tampered")
	_, _, err = Build(context.Background(), o)
	assert.ErrorContains(t, err, "SHA256SUMS says")
	_, err = os.Stat(filepath.Join(o.CacheRoot, "ubuntu", "noble", UbuntuBase.Serial, UbuntuBase.File))
	assert.ErrorIs(t, err, os.ErrNotExist, "a base image that fails its digest is not kept")
	for _, c := range run.cmds {
		assert.False(t, strings.HasPrefix(c, "qemu-img") || strings.HasPrefix(c, "virt-customize"), c)
	}
}

// closedURL is an https URL on loopback where nothing listens.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "https://" + addr + "/"
}

// TestBuildRefusesUnreachable: without NVIDIA's repository the CUDA build
// stops before writing anything, with a message saying what is missing.
func TestBuildRefusesUnreachable(t *testing.T) {
	t.Parallel()
	m := newMirror(t)
	run := &fakeRunner{signer: UbuntuBase.KeyFinger}
	o := buildOptions(t, m, CUDARecipe(), run)
	o.RepoURL = closedURL(t)
	_, _, err := Build(context.Background(), o)
	var ue *UnreachableError
	require.ErrorAs(t, err, &ue)
	assert.Equal(t, "NVIDIA's CUDA repository", ue.What)
	assert.Contains(t, err.Error(), "NVIDIA's CUDA repository "+o.RepoURL+"InRelease is unreachable from this machine")
	assert.Contains(t, err.Error(), "point the build at a mirror")
	assert.Empty(t, run.cmds)
	_, err = os.Stat(o.CacheRoot)
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing written")

	// A repository that answers 404 is as good as absent.
	o.RepoURL = m.srv.URL + "/elsewhere/"
	_, _, err = Build(context.Background(), o)
	require.ErrorAs(t, err, &ue)
	assert.Contains(t, err.Error(), "HTTP 404")

	// The base image alone needs no NVIDIA repository.
	b := buildOptions(t, m, BaseRecipe(), run)
	b.RepoURL = closedURL(t)
	_, _, err = Build(context.Background(), b)
	require.NoError(t, err)
}

// TestMkcudaRefuses runs the command `make cuda-image` runs, pointed at
// loopback addresses where nothing listens: it exits 3 with the message.
func TestMkcudaRefuses(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "mkcuda")
	out, err := exec.Command("go", "build", "-o", bin, "../cmd/mkcuda").CombinedOutput()
	require.NoError(t, err, "%s", out)
	cmd := exec.Command(bin, "-cache", t.TempDir(), "-repo", closedURL(t), "-base-server", closedURL(t))
	out, err = cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, 3, ee.ExitCode(), "%s", out)
	assert.Contains(t, string(out), "mkcuda: Ubuntu's cloud image release https://127.0.0.1:")
	assert.Contains(t, string(out), "is unreachable from this machine")

	out, err = exec.Command(bin, "-print").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "Pin: version "+DriverVersion+"-0ubuntu1")
	assert.Contains(t, string(out), `"kind": "slice_cuda"`)
}

func TestParsers(t *testing.T) {
	t.Parallel()
	d := strings.Repeat("ab", 32)
	got, err := ParseSHA256SUMS(d+" *ubuntu.img\n"+strings.Repeat("cd", 32)+"  other.img\n", "ubuntu.img")
	require.NoError(t, err)
	assert.Equal(t, d, got)
	got, err = ParseSHA256SUMS(strings.Repeat("cd", 32)+"  other.img\n", "other.img")
	require.NoError(t, err)
	assert.Equal(t, strings.Repeat("cd", 32), got)
	_, err = ParseSHA256SUMS(d+" *ubuntu.img\n", "missing.img")
	assert.ErrorContains(t, err, "lists no missing.img")
	_, err = ParseSHA256SUMS("XYZ *ubuntu.img\n", "ubuntu.img")
	assert.ErrorContains(t, err, "digest")

	assert.Equal(t, "D2EB44626FDDC30B513D5BB71A5D6C4C7DB87C81", ParseValidSig("[GNUPG:] NEWSIG\n[GNUPG:] VALIDSIG 4A3CE3CD565D7EB5C810E2B97FF3F408476CF100 2024-04-23 1713900000 0 4 0 1 10 00 D2EB44626FDDC30B513D5BB71A5D6C4C7DB87C81\n"))
	assert.Equal(t, "", ParseValidSig("[GNUPG:] BADSIG 1A5D6C4C7DB87C81 x\n"))
	assert.Equal(t, "", ParseValidSig(""))
}
