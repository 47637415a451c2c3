// Package apps builds the repository's own launchable app images: small Go
// programs (images/apps/<name>) packed as OCI image layout archives (a tar
// of oci-layout, index.json and blobs/sha256/*, image-spec v1.1 "OCI Image
// Layout"), which the agent's app runners unpack and run with a real OCI
// runtime (agent/apprun).
//
// The build is deterministic: the binary is built with -trimpath and an
// empty build ID, the layer and the archive carry fixed modes, owners and
// times, gzip has no header time, and every JSON document is encoded from
// Go structs in a fixed field order. The same source and Go toolchain give
// the same manifest digest, which is what an app manifest names
// ("gpuaas.lab/apps/hello@sha256:...").
//
// The layout is written by hand rather than with go-containerregistry: an
// image of one layer is five small documents, written with the OCI types
// the reader (agent/apprun) checks every field of.
package apps

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"time"

	"github.com/gpuaas/gpuaas/agent/apprun"
)

// Hello is the repository's test app (images/apps/hello).
var Hello = App{
	Name: "hello", Version: "1.0.0", Package: "./images/apps/hello",
	Repository: "gpuaas.lab/apps/hello", Port: 8080,
}

// App is one repo-built app image.
type App struct {
	Name       string // binary name, /<name> in the image
	Version    string // the layout's ref name (tag)
	Package    string // module-relative main package
	Repository string // the repository an app manifest names it under
	Port       int    // $PORT and the exposed port
}

// Built is a built app image.
type Built struct {
	// Path is the OCI image layout archive (a tar).
	Path string
	// Digest is the OCI image manifest's digest ("sha256:<hex>"); Ref is
	// Repository@Digest. An app manifest's image field names the archive
	// instead: Repository@sha256:ArchiveSHA256.
	Digest string
	Ref    string
	// ArchiveSHA256 is the hex sha256 of the archive file itself (what
	// the coordinator's blob store keys it by); Size its length.
	ArchiveSHA256 string
	Size          int64
}

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// Build compiles a (a static linux/amd64 binary) from the module at
// moduleDir and writes its OCI image layout archive to out.
func Build(ctx context.Context, moduleDir string, a App, out string) (Built, error) {
	if !namePattern.MatchString(a.Name) {
		return Built{}, fmt.Errorf("app name %q: want lowercase letters, digits and dashes", a.Name)
	}
	work, err := os.MkdirTemp("", "gpuaas-app-"+a.Name+"-")
	if err != nil {
		return Built{}, fmt.Errorf("build app %s: %w", a.Name, err)
	}
	defer os.RemoveAll(work)
	bin := filepath.Join(work, a.Name)
	cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", bin, a.Package)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=-buildvcs=false")
	if o, err := cmd.CombinedOutput(); err != nil {
		return Built{}, fmt.Errorf("build app %s: go build %s: %w: %s", a.Name, a.Package, err, bytes.TrimSpace(o))
	}
	exe, err := os.ReadFile(bin)
	if err != nil {
		return Built{}, fmt.Errorf("build app %s: %w", a.Name, err)
	}
	layout, digest, err := Layout(a, exe)
	if err != nil {
		return Built{}, err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return Built{}, fmt.Errorf("write %s: %w", out, err)
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, layout, 0o644); err != nil {
		return Built{}, fmt.Errorf("write %s: %w", out, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return Built{}, fmt.Errorf("write %s: %w", out, err)
	}
	sum := sha256.Sum256(layout)
	return Built{Path: out, Digest: digest, Ref: a.Repository + "@" + digest,
		ArchiveSHA256: hex.EncodeToString(sum[:]), Size: int64(len(layout))}, nil
}

// goTool is the go command: on $PATH, else the usual install location.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/local/go/bin/go"); err == nil {
		return "/usr/local/go/bin/go"
	}
	return "go"
}

// epoch is every file's modification time: the image carries no build time.
var epoch = time.Unix(0, 0).UTC()

// Layout returns the OCI image layout archive of an image with exe as
// /<name> (its entrypoint, run as nobody), and the manifest digest.
func Layout(a App, exe []byte) ([]byte, string, error) {
	passwd := "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
	group := "root:x:0:\nnogroup:x:65534:\n"
	layer, err := tarOf([]tarFile{
		{Name: "etc/", Mode: 0o755, Dir: true},
		{Name: "etc/group", Mode: 0o644, Data: []byte(group)},
		{Name: "etc/passwd", Mode: 0o644, Data: []byte(passwd)},
		{Name: "tmp/", Mode: 0o1777, Dir: true},
		{Name: a.Name, Mode: 0o755, Data: exe},
	})
	if err != nil {
		return nil, "", fmt.Errorf("app %s layer: %w", a.Name, err)
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, "", err
	}
	// The zero ModTime writes no time into the gzip header.
	if _, err := zw.Write(layer); err != nil {
		return nil, "", err
	}
	if err := zw.Close(); err != nil {
		return nil, "", err
	}
	port := fmt.Sprintf("%d", a.Port)
	cfg := apprun.ImageConfig{Architecture: "amd64", OS: "linux",
		Config: apprun.ContainerConfig{
			User:         "65534:65534",
			ExposedPorts: map[string]struct{}{port + "/tcp": {}},
			Env:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PORT=" + port},
			Entrypoint:   []string{"/" + a.Name},
			WorkingDir:   "/",
			Labels:       map[string]string{"org.opencontainers.image.title": a.Name, "org.opencontainers.image.version": a.Version},
		},
		RootFS: apprun.RootFS{Type: "layers", DiffIDs: []string{digestOf(layer)}},
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return nil, "", err
	}
	man := apprun.Manifest{SchemaVersion: 2, MediaType: apprun.MediaTypeManifest,
		Config: apprun.Descriptor{MediaType: apprun.MediaTypeConfig, Digest: digestOf(cfgJSON), Size: int64(len(cfgJSON))},
		Layers: []apprun.Descriptor{{MediaType: apprun.MediaTypeLayerGzip, Digest: digestOf(gz.Bytes()), Size: int64(gz.Len())}},
	}
	manJSON, err := json.Marshal(man)
	if err != nil {
		return nil, "", err
	}
	digest := digestOf(manJSON)
	idx := apprun.Index{SchemaVersion: 2, MediaType: apprun.MediaTypeIndex, Manifests: []apprun.Descriptor{{
		MediaType: apprun.MediaTypeManifest, Digest: digest, Size: int64(len(manJSON)),
		Annotations: map[string]string{apprun.AnnotationRefName: a.Version},
	}}}
	idxJSON, err := json.Marshal(idx)
	if err != nil {
		return nil, "", err
	}
	files := []tarFile{
		{Name: "blobs/", Mode: 0o755, Dir: true},
		{Name: "blobs/sha256/", Mode: 0o755, Dir: true},
		{Name: "index.json", Mode: 0o644, Data: idxJSON},
		{Name: "oci-layout", Mode: 0o644, Data: []byte(`{"imageLayoutVersion":"` + apprun.LayoutVersion + `"}`)},
	}
	for _, b := range [][]byte{cfgJSON, gz.Bytes(), manJSON} {
		files = append(files, tarFile{Name: "blobs/sha256/" + digestOf(b)[len("sha256:"):], Mode: 0o644, Data: b})
	}
	archive, err := tarOf(files)
	if err != nil {
		return nil, "", fmt.Errorf("app %s layout: %w", a.Name, err)
	}
	return archive, digest, nil
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

type tarFile struct {
	Name string
	Mode int64
	Dir  bool
	Data []byte
}

// tarOf writes files sorted by name, owned by root, at the epoch.
func tarOf(files []tarFile) ([]byte, error) {
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.Name, Mode: f.Mode, ModTime: epoch, Format: tar.FormatPAX,
			Uname: "root", Gname: "root", Typeflag: tar.TypeReg, Size: int64(len(f.Data))}
		if f.Dir {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.Name, err)
		}
		if _, err := io.Copy(tw, bytes.NewReader(f.Data)); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
