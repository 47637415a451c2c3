package cuda

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/images/guest"
)

// Cmd is one external command of a build.
type Cmd struct {
	Name string
	Args []string
}

func (c Cmd) String() string { return strings.Join(append([]string{c.Name}, c.Args...), " ") }

// Runner runs the build's external commands (gpgv, qemu-img,
// virt-customize); tests substitute a recording fake.
type Runner interface {
	Run(ctx context.Context, c Cmd) ([]byte, error)
}

// ExecRunner runs commands with os/exec.
type ExecRunner struct{}

// Run runs c and returns its combined output; a failure includes it.
func (ExecRunner) Run(ctx context.Context, c Cmd) ([]byte, error) {
	out, err := exec.CommandContext(ctx, c.Name, c.Args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: %w: %s", c.Name, err, bytes.TrimSpace(out))
	}
	return out, nil
}

// Tools are the commands a build needs on the builder.
var Tools = []string{"gpgv", "qemu-img", "virt-customize"}

// DefaultBaseKeyring holds Ubuntu's cloud image signing key (package
// ubuntu-cloudimage-keyring on Ubuntu builders).
const DefaultBaseKeyring = "/usr/share/keyrings/ubuntu-cloudimage-keyring.gpg"

// Options say where a build reads and writes. Zero values take the
// recipe's sources and $GPUAAS_IMAGE_CACHE (else ~/.cache/gpuaas/images).
type Options struct {
	Recipe      Recipe
	CacheRoot   string
	BaseServer  string // mirror of Ubuntu's cloud image server ("" = the recipe's)
	RepoURL     string // mirror of NVIDIA's repository ("" = the recipe's)
	BaseKeyring string // default DefaultBaseKeyring
	HTTP        *http.Client
	Runner      Runner
	Log         *slog.Logger
}

func (o Options) withDefaults() (Options, error) {
	if o.BaseServer != "" {
		o.Recipe.Base.Server = o.BaseServer
	}
	if o.RepoURL != "" && o.Recipe.Repo != nil {
		repo := *o.Recipe.Repo
		repo.URL = o.RepoURL
		o.Recipe.Repo = &repo
	}
	if o.CacheRoot == "" {
		var err error
		if o.CacheRoot, err = guest.DefaultCacheRoot(); err != nil {
			return o, err
		}
	}
	if o.BaseKeyring == "" {
		o.BaseKeyring = DefaultBaseKeyring
	}
	if o.HTTP == nil {
		o.HTTP = &http.Client{Timeout: 30 * time.Minute}
	}
	if o.Runner == nil {
		o.Runner = ExecRunner{}
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return o, o.Recipe.Validate()
}

// UnreachableError is a source a build needs that this machine cannot
// reach. Nothing has been written when it is returned.
type UnreachableError struct {
	What string
	URL  string
	Err  error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("%s %s is unreachable from this machine (%v): the image cannot be built here; "+
		"build on a machine that reaches it, or point the build at a mirror (-repo / -base-server). "+
		"The lab's CUDA image (make guest-image-cuda) needs no network", e.What, e.URL, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// Preflight checks, before anything is written, that every source of r
// answers: Ubuntu's release directory and, for the CUDA layer, NVIDIA's
// repository (its InRelease index and its key).
func Preflight(ctx context.Context, client *http.Client, r Recipe) error {
	type source struct{ what, url string }
	srcs := []source{{"Ubuntu's cloud image release", r.Base.SumsURL()}}
	if r.Repo != nil {
		srcs = append(srcs, source{"NVIDIA's CUDA repository", r.Repo.URL + "InRelease"}, source{"NVIDIA's CUDA repository key", r.Repo.URL + r.Repo.Key})
	}
	for _, s := range srcs {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		req, err := http.NewRequestWithContext(cctx, http.MethodHead, s.url, nil)
		if err != nil {
			cancel()
			return fmt.Errorf("preflight %s: %w", s.url, err)
		}
		resp, err := client.Do(req)
		cancel()
		if err != nil {
			return &UnreachableError{What: s.what, URL: s.url, Err: err}
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return &UnreachableError{What: s.what, URL: s.url, Err: fmt.Errorf("HTTP %s", resp.Status)}
		}
	}
	return nil
}

// ParseSHA256SUMS returns the digest of file in a SHA256SUMS listing.
func ParseSHA256SUMS(content, file string) (string, error) {
	for _, line := range strings.Split(content, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && strings.TrimPrefix(f[1], "*") == file {
			if len(f[0]) != 64 || strings.Trim(f[0], "0123456789abcdef") != "" {
				return "", fmt.Errorf("SHA256SUMS: %s has digest %q", file, f[0])
			}
			return f[0], nil
		}
	}
	return "", fmt.Errorf("SHA256SUMS lists no %s", file)
}

// ParseValidSig returns the primary key fingerprint of gpgv's
// "[GNUPG:] VALIDSIG" status line ("" when the signature is not valid).
func ParseValidSig(status string) string {
	for _, line := range strings.Split(status, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "[GNUPG:]" && f[1] == "VALIDSIG" {
			// VALIDSIG <sig fpr> <date> <ts> <expire> <ver> <res> <pk algo> <hash algo> <class> <primary fpr>
			if len(f) >= 12 {
				return f[11]
			}
			return f[2]
		}
	}
	return ""
}

// Build makes o.Recipe's image into CacheRoot/<name>/<version>/ (disk.raw,
// its manifest.json) and returns the manifest and the image path. It
// refuses before writing anything when a source is unreachable
// (*UnreachableError) or a tool is missing.
func Build(ctx context.Context, opts Options) (Manifest, string, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return Manifest{}, "", err
	}
	r := o.Recipe
	if err := Preflight(ctx, o.HTTP, r); err != nil {
		return Manifest{}, "", err
	}
	if _, ok := o.Runner.(ExecRunner); ok {
		if err := CheckTools(); err != nil {
			return Manifest{}, "", err
		}
	}
	if _, err := os.Stat(o.BaseKeyring); err != nil {
		return Manifest{}, "", fmt.Errorf("read Ubuntu's cloud image key: %w (install ubuntu-cloudimage-keyring or pass -base-keyring)", err)
	}
	start := time.Now()
	log := o.Log.With("image", r.Name, "version", r.Version)

	// 1. The base image, its digest checked against the signed SHA256SUMS.
	baseDir := filepath.Join(o.CacheRoot, "ubuntu", r.Base.Codename, r.Base.Serial)
	if err := os.MkdirAll(baseDir, 0o755); err != nil {
		return Manifest{}, "", fmt.Errorf("base image cache: %w", err)
	}
	sums, sig, img := filepath.Join(baseDir, "SHA256SUMS"), filepath.Join(baseDir, "SHA256SUMS.gpg"), filepath.Join(baseDir, r.Base.File)
	for _, f := range [][2]string{{r.Base.SumsURL(), sums}, {r.Base.SumsURL() + ".gpg", sig}} {
		if err := download(ctx, o.HTTP, f[0], f[1]); err != nil {
			return Manifest{}, "", err
		}
	}
	out, err := o.Runner.Run(ctx, Cmd{Name: "gpgv", Args: []string{"--status-fd", "1", "--keyring", o.BaseKeyring, sig, sums}})
	if err != nil {
		return Manifest{}, "", fmt.Errorf("verify %s: %w", r.Base.SumsURL(), err)
	}
	if fpr := ParseValidSig(string(out)); fpr != r.Base.KeyFinger {
		return Manifest{}, "", fmt.Errorf("verify %s: signed by %q, pinned key is %s", r.Base.SumsURL(), fpr, r.Base.KeyFinger)
	}
	sumsText, err := os.ReadFile(sums)
	if err != nil {
		return Manifest{}, "", err
	}
	want, err := ParseSHA256SUMS(string(sumsText), r.Base.File)
	if err != nil {
		return Manifest{}, "", err
	}
	if got, err := fileSHA256(img); err != nil || got != want {
		if err := download(ctx, o.HTTP, r.Base.URL(), img); err != nil {
			return Manifest{}, "", err
		}
		if got, err = fileSHA256(img); err != nil {
			return Manifest{}, "", err
		}
		if got != want {
			os.Remove(img)
			return Manifest{}, "", fmt.Errorf("base image %s: sha256 %s, SHA256SUMS says %s", r.Base.URL(), got, want)
		}
	}
	log.Info("base image verified", "file", img, "sha256", want)

	// 2. Raw disk, grown, customised.
	outDir := filepath.Join(o.CacheRoot, r.Name, r.Version)
	work, err := os.MkdirTemp(o.CacheRoot, "."+r.Name+"-")
	if err != nil {
		return Manifest{}, "", fmt.Errorf("build %s: %w", r.Name, err)
	}
	defer os.RemoveAll(work)
	raw := filepath.Join(work, "disk.raw")
	var rnd [32]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return Manifest{}, "", fmt.Errorf("marker: %w", err)
	}
	marker := []byte(r.Name + " marker " + hex.EncodeToString(rnd[:]) + "\n")
	markerSum := sha256.Sum256(marker)
	files := map[string]string{"99-gpuaas.cfg": r.CloudConfig(), "customize.sh": r.Script(), "marker": string(marker)}
	if r.Repo != nil {
		files["gpuaas-cuda.pref"], files["cuda.list"] = r.AptPreferences(), r.AptSource()
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(work, name), []byte(content), 0o644); err != nil {
			return Manifest{}, "", fmt.Errorf("build %s: %w", r.Name, err)
		}
	}
	for _, c := range CustomizeCommands(r, img, work) {
		if _, err := o.Runner.Run(ctx, c); err != nil {
			return Manifest{}, "", fmt.Errorf("build %s: %w", r.Name, err)
		}
	}

	// 3. Digest and manifest, moved into place.
	m := r.Manifest()
	m.BaseSHA256, m.MarkerSHA256 = want, hex.EncodeToString(markerSum[:])
	if m.SHA256, err = fileSHA256(raw); err != nil {
		return Manifest{}, "", err
	}
	st, err := os.Stat(raw)
	if err != nil {
		return Manifest{}, "", fmt.Errorf("build %s: %w", r.Name, err)
	}
	m.Size = st.Size()
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Manifest{}, "", err
	}
	if err := os.WriteFile(filepath.Join(work, "manifest.json"), append(b, '\n'), 0o644); err != nil {
		return Manifest{}, "", err
	}
	for _, name := range append([]string{"marker"}, keys(files)...) {
		os.Remove(filepath.Join(work, name))
	}
	if err := os.MkdirAll(filepath.Dir(outDir), 0o755); err != nil {
		return Manifest{}, "", err
	}
	if err := os.RemoveAll(outDir); err != nil {
		return Manifest{}, "", err
	}
	if err := os.Rename(work, outDir); err != nil {
		return Manifest{}, "", fmt.Errorf("install %s: %w", outDir, err)
	}
	log.Info("slice image built", "path", filepath.Join(outDir, "disk.raw"), "sha256", m.SHA256, "elapsed", time.Since(start).Round(time.Second))
	return m, filepath.Join(outDir, "disk.raw"), nil
}

// CustomizeCommands are the commands turning the verified base image into
// r's raw disk in work (where Build wrote the generated files).
func CustomizeCommands(r Recipe, baseImg, work string) []Cmd {
	raw := filepath.Join(work, "disk.raw")
	args := []string{"-a", raw, "--format", "raw", "--network",
		"--run-command", "growpart /dev/sda 1 && resize2fs /dev/sda1",
		"--mkdir", filepath.Dir(CloudCfgPath), "--upload", filepath.Join(work, "99-gpuaas.cfg") + ":" + CloudCfgPath}
	if r.Repo != nil {
		args = append(args, "--upload", filepath.Join(work, "gpuaas-cuda.pref")+":"+AptPrefsPath,
			"--upload", filepath.Join(work, "cuda.list")+":"+AptSourcePath)
	}
	args = append(args, "--run", filepath.Join(work, "customize.sh"),
		"--upload", filepath.Join(work, "marker")+":/boot/efi"+MarkerPath)
	return []Cmd{
		{Name: "qemu-img", Args: []string{"convert", "-f", "qcow2", "-O", "raw", baseImg, raw}},
		{Name: "qemu-img", Args: []string{"resize", "-f", "raw", raw, strconv.Itoa(r.SizeGiB) + "G"}},
		{Name: "virt-customize", Args: args},
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// download fetches url into path through a .part file.
func download(ctx context.Context, client *http.Client, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("download %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return &UnreachableError{What: "source", URL: url, Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("download %s: HTTP %s", url, resp.Status)
	}
	part := path + ".part"
	f, err := os.Create(part)
	if err != nil {
		return fmt.Errorf("download %s: %w", url, err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		os.Remove(part)
		return fmt.Errorf("download %s: %w", url, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("download %s: %w", url, err)
	}
	return os.Rename(part, path)
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ErrNoTool is returned (wrapped) by CheckTools.
var ErrNoTool = errors.New("tool not installed")

// CheckTools reports the first of Tools missing from PATH.
func CheckTools() error {
	for _, t := range Tools {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("%s: %w (packages gpgv, qemu-utils, libguestfs-tools)", t, ErrNoTool)
		}
	}
	return nil
}
