package apprun

// OCI image layout reading and layer unpacking (image-spec v1.1). An app's
// image arrives as an OCI image layout archive (a tar of oci-layout,
// index.json and blobs/sha256/*). OpenLayout unpacks the archive's blobs,
// checking each against the digest it is named by, and resolves the
// manifest the app names by digest; Unpack applies its layers, in order,
// into a root filesystem, checking each layer's uncompressed digest
// against the configuration's diff_ids and honouring whiteouts.

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// OCI media types (image-spec v1.1, and the Docker v2 schema 2 ones a
// layout converted from a Docker registry carries).
const (
	MediaTypeIndex          = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest       = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig         = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer          = "application/vnd.oci.image.layer.v1.tar"
	MediaTypeLayerGzip      = "application/vnd.oci.image.layer.v1.tar+gzip"
	MediaTypeDockerManifest = "application/vnd.docker.distribution.manifest.v2+json"
	MediaTypeDockerList     = "application/vnd.docker.distribution.manifest.list.v2+json"
	MediaTypeDockerConfig   = "application/vnd.docker.container.image.v1+json"
	MediaTypeDockerLayer    = "application/vnd.docker.image.rootfs.diff.tar.gzip"
	// AnnotationRefName names a manifest inside a layout's index.
	AnnotationRefName = "org.opencontainers.image.ref.name"
	// LayoutVersion is the oci-layout file's imageLayoutVersion.
	LayoutVersion = "1.0.0"
)

// Descriptor is an OCI content descriptor.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *Platform         `json:"platform,omitempty"`
}

// Platform is an index entry's platform.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Index is an OCI image index (a layout's index.json).
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType,omitempty"`
	Manifests     []Descriptor `json:"manifests"`
}

// Manifest is an OCI image manifest.
type Manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType,omitempty"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// ImageConfig is the part of an OCI image configuration a runner uses.
type ImageConfig struct {
	Architecture string          `json:"architecture"`
	OS           string          `json:"os"`
	Config       ContainerConfig `json:"config"`
	RootFS       RootFS          `json:"rootfs"`
}

// ContainerConfig is the image configuration's execution parameters.
type ContainerConfig struct {
	User         string              `json:"User,omitempty"`
	ExposedPorts map[string]struct{} `json:"ExposedPorts,omitempty"`
	Env          []string            `json:"Env,omitempty"`
	Entrypoint   []string            `json:"Entrypoint,omitempty"`
	Cmd          []string            `json:"Cmd,omitempty"`
	WorkingDir   string              `json:"WorkingDir,omitempty"`
	Labels       map[string]string   `json:"Labels,omitempty"`
}

// RootFS lists the uncompressed layer digests (diff IDs).
type RootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// Image is an opened, verified image layout.
type Image struct {
	// Dir holds the layout's verified blobs (blobs/sha256/<hex>).
	Dir      string
	Digest   string // the manifest's digest
	Manifest Manifest
	Config   ImageConfig
}

// Limits on what an image layout archive may hold.
const (
	maxLayoutJSON   = 4 << 20 // index, manifest and config documents
	maxLayers       = 128
	maxLayoutBlobs  = 4 * maxLayers
	maxUnpackedSize = 64 << 30
)

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// ImageDigest returns the digest part of an app's image reference
// ("<repository>@sha256:<hex>").
func ImageDigest(ref string) (string, error) {
	_, d, ok := strings.Cut(ref, "@")
	if !ok || !digestPattern.MatchString(d) {
		return "", fmt.Errorf("image %q does not name a sha256 digest", ref)
	}
	return d, nil
}

// OpenLayout extracts the layout archive at archive into dir (which it
// creates), verifying every blob against its name, and resolves the image
// manifest with digest want: an entry of index.json, or the linux/amd64
// entry of an index index.json names by that digest. want may instead be
// the sha256 of the archive file itself (how a blob store keys it): then
// index.json must name exactly one image, which is the one.
func OpenLayout(archive, dir, want string) (*Image, error) {
	if !digestPattern.MatchString(want) {
		return nil, fmt.Errorf("image layout %s: %q is not a sha256 digest", archive, want)
	}
	f, err := os.Open(archive)
	if err != nil {
		return nil, fmt.Errorf("image layout: %w", err)
	}
	defer f.Close()
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o700); err != nil {
		return nil, fmt.Errorf("image layout: %w", err)
	}
	img := &Image{Dir: dir}
	var index, layout []byte
	blobs := 0
	whole := sha256.New()
	tr := tar.NewReader(io.TeeReader(f, whole))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("image layout %s: %w", archive, err)
		}
		name := strings.TrimPrefix(path.Clean(strings.TrimPrefix(h.Name, "./")), "/")
		switch {
		case h.Typeflag == tar.TypeDir && (name == "blobs" || name == "blobs/sha256" || name == "."):
		case name == "index.json" && h.Typeflag == tar.TypeReg:
			if index, err = readLimited(tr, maxLayoutJSON, "index.json"); err != nil {
				return nil, fmt.Errorf("image layout %s: %w", archive, err)
			}
		case name == "oci-layout" && h.Typeflag == tar.TypeReg:
			if layout, err = readLimited(tr, maxLayoutJSON, "oci-layout"); err != nil {
				return nil, fmt.Errorf("image layout %s: %w", archive, err)
			}
		case strings.HasPrefix(name, "blobs/sha256/") && h.Typeflag == tar.TypeReg:
			hexd := strings.TrimPrefix(name, "blobs/sha256/")
			if !digestPattern.MatchString("sha256:" + hexd) {
				return nil, fmt.Errorf("image layout %s: blob name %q is not a sha256 hex digest", archive, name)
			}
			if blobs++; blobs > maxLayoutBlobs {
				return nil, fmt.Errorf("image layout %s: more than %d blobs", archive, maxLayoutBlobs)
			}
			if err := writeBlob(filepath.Join(dir, "blobs", "sha256", hexd), tr, hexd); err != nil {
				return nil, fmt.Errorf("image layout %s: %w", archive, err)
			}
		default:
			// Other files (e.g. a Docker manifest.json beside the
			// layout) are not part of the image spec's layout; ignore.
		}
	}
	if _, err := io.Copy(whole, f); err != nil { // what follows the tar's end
		return nil, fmt.Errorf("image layout %s: %w", archive, err)
	}
	archiveDigest := "sha256:" + hex.EncodeToString(whole.Sum(nil))
	if layout == nil || index == nil {
		return nil, fmt.Errorf("image layout %s: no oci-layout or index.json (not an OCI image layout archive)", archive)
	}
	var lv struct {
		ImageLayoutVersion string `json:"imageLayoutVersion"`
	}
	if err := json.Unmarshal(layout, &lv); err != nil || lv.ImageLayoutVersion != LayoutVersion {
		return nil, fmt.Errorf("image layout %s: oci-layout %q: want imageLayoutVersion %s", archive, layout, LayoutVersion)
	}
	var idx Index
	if err := json.Unmarshal(index, &idx); err != nil {
		return nil, fmt.Errorf("image layout %s: index.json: %w", archive, err)
	}
	if want == archiveDigest {
		if len(idx.Manifests) != 1 {
			return nil, fmt.Errorf("image layout %s: named by the archive's digest, its index.json must name one image, not %d", archive, len(idx.Manifests))
		}
		want = idx.Manifests[0].Digest
	}
	desc, err := img.resolve(idx, want)
	if err != nil {
		return nil, fmt.Errorf("image layout %s: %w", archive, err)
	}
	if err := img.readJSON(desc, &img.Manifest); err != nil {
		return nil, fmt.Errorf("image layout %s: manifest: %w", archive, err)
	}
	img.Digest = desc.Digest
	m := img.Manifest
	if m.SchemaVersion != 2 {
		return nil, fmt.Errorf("image layout %s: manifest schemaVersion %d, want 2", archive, m.SchemaVersion)
	}
	if m.Config.MediaType != MediaTypeConfig && m.Config.MediaType != MediaTypeDockerConfig {
		return nil, fmt.Errorf("image layout %s: config media type %q is not an image configuration", archive, m.Config.MediaType)
	}
	if err := img.readJSON(m.Config, &img.Config); err != nil {
		return nil, fmt.Errorf("image layout %s: config: %w", archive, err)
	}
	c := img.Config
	if c.OS != "linux" || c.Architecture != "amd64" {
		return nil, fmt.Errorf("image layout %s: image is %s/%s, this host runs linux/amd64", archive, c.OS, c.Architecture)
	}
	if len(m.Layers) == 0 || len(m.Layers) > maxLayers {
		return nil, fmt.Errorf("image layout %s: %d layers, want 1..%d", archive, len(m.Layers), maxLayers)
	}
	if len(c.RootFS.DiffIDs) != len(m.Layers) {
		return nil, fmt.Errorf("image layout %s: config names %d diff_ids for %d layers", archive, len(c.RootFS.DiffIDs), len(m.Layers))
	}
	for i, l := range m.Layers {
		if _, err := layerCompression(l.MediaType); err != nil {
			return nil, fmt.Errorf("image layout %s: layer %d: %w", archive, i, err)
		}
		if err := img.checkBlob(l); err != nil {
			return nil, fmt.Errorf("image layout %s: layer %d: %w", archive, i, err)
		}
	}
	return img, nil
}

func (img *Image) resolve(idx Index, want string) (Descriptor, error) {
	for _, d := range idx.Manifests {
		if d.Digest != want {
			continue
		}
		switch d.MediaType {
		case MediaTypeManifest, MediaTypeDockerManifest:
			return d, nil
		case MediaTypeIndex, MediaTypeDockerList:
			var sub Index
			if err := img.readJSON(d, &sub); err != nil {
				return Descriptor{}, fmt.Errorf("index %s: %w", d.Digest, err)
			}
			for _, m := range sub.Manifests {
				if m.Platform != nil && m.Platform.OS == "linux" && m.Platform.Architecture == "amd64" &&
					(m.MediaType == MediaTypeManifest || m.MediaType == MediaTypeDockerManifest) {
					return m, nil
				}
			}
			return Descriptor{}, fmt.Errorf("index %s has no linux/amd64 image manifest", d.Digest)
		default:
			return Descriptor{}, fmt.Errorf("index.json entry %s has media type %q, not an image manifest or index", d.Digest, d.MediaType)
		}
	}
	return Descriptor{}, fmt.Errorf("index.json names no manifest %s (the layout is not the image the app names)", want)
}

func (img *Image) blobPath(d Descriptor) (string, error) {
	if !digestPattern.MatchString(d.Digest) {
		return "", fmt.Errorf("descriptor digest %q is not a sha256 digest", d.Digest)
	}
	return filepath.Join(img.Dir, "blobs", "sha256", strings.TrimPrefix(d.Digest, "sha256:")), nil
}

// checkBlob checks that d's blob is in the layout with d's size (its
// content was checked against the digest when it was extracted).
func (img *Image) checkBlob(d Descriptor) error {
	p, err := img.blobPath(d)
	if err != nil {
		return err
	}
	st, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("blob %s is not in the layout", d.Digest)
	}
	if st.Size() != d.Size {
		return fmt.Errorf("blob %s is %d bytes, its descriptor says %d", d.Digest, st.Size(), d.Size)
	}
	return nil
}

func (img *Image) readJSON(d Descriptor, v any) error {
	if d.Size > maxLayoutJSON {
		return fmt.Errorf("%s is %d bytes; at most %d allowed", d.Digest, d.Size, maxLayoutJSON)
	}
	if err := img.checkBlob(d); err != nil {
		return err
	}
	p, _ := img.blobPath(d)
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", d.Digest, err)
	}
	return nil
}

func readLimited(r io.Reader, limit int64, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", what, limit)
	}
	return b, nil
}

// writeBlob copies r to p and fails unless its sha256 is hexd.
func writeBlob(p string, r io.Reader, hexd string) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, h), r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("blob %s: %w", hexd, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != hexd {
		os.Remove(p)
		return fmt.Errorf("blob sha256:%s has digest sha256:%s (corrupt or tampered)", hexd, got)
	}
	return nil
}

func layerCompression(mediaType string) (gz bool, err error) {
	switch mediaType {
	case MediaTypeLayer:
		return false, nil
	case MediaTypeLayerGzip, MediaTypeDockerLayer:
		return true, nil
	}
	return false, fmt.Errorf("layer media type %q is not supported (want %s or %s)", mediaType, MediaTypeLayer, MediaTypeLayerGzip)
}

// Unpack applies the image's layers in order into rootfs (created if
// needed), as root: owners and modes as the layers say. Device nodes in
// layers are skipped (the runtime makes /dev).
func (img *Image) Unpack(rootfs string) error {
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return fmt.Errorf("unpack: %w", err)
	}
	var total int64
	for i, l := range img.Manifest.Layers {
		if err := img.applyLayer(rootfs, l, img.Config.RootFS.DiffIDs[i], &total); err != nil {
			return fmt.Errorf("unpack layer %d (%s): %w", i, l.Digest, err)
		}
	}
	return nil
}

func (img *Image) applyLayer(root string, l Descriptor, diffID string, total *int64) error {
	p, err := img.blobPath(l)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	var r io.Reader = f
	if gz, _ := layerCompression(l.MediaType); gz {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	}
	h := sha256.New()
	tr := tar.NewReader(io.TeeReader(r, h))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if *total += hdr.Size; *total > maxUnpackedSize {
			return fmt.Errorf("image unpacks to more than %d bytes", int64(maxUnpackedSize))
		}
		if err := applyEntry(root, hdr, tr); err != nil {
			return err
		}
	}
	// Drain the padding so the digest covers the whole stream.
	if _, err := io.Copy(io.Discard, tr); err != nil {
		return err
	}
	if _, err := io.Copy(h, r); err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != diffID {
		return fmt.Errorf("uncompressed layer digest %s, config's diff_id says %s", got, diffID)
	}
	return nil
}

// cleanEntry returns a layer entry's path relative to the root, or an
// error when it climbs out of it.
func cleanEntry(name string) (string, error) {
	c := path.Clean("/" + name)
	if c == "/" {
		return "", nil
	}
	rel := strings.TrimPrefix(c, "/")
	for _, part := range strings.Split(rel, "/") {
		if part == ".." {
			return "", fmt.Errorf("entry %q leaves the root", name)
		}
	}
	return rel, nil
}

// parentIn makes sure rel's parent directories exist under root as real
// directories (never a symlink, which could point out of the root) and
// returns the host path of rel.
func parentIn(root, rel string) (string, error) {
	parts := strings.Split(rel, "/")
	cur := root
	for _, part := range parts[:len(parts)-1] {
		cur = filepath.Join(cur, part)
		st, err := os.Lstat(cur)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(cur, 0o755); err != nil {
				return "", err
			}
		case err != nil:
			return "", err
		case st.Mode()&fs.ModeSymlink != 0:
			return "", fmt.Errorf("entry %q goes through the symbolic link %q", rel, strings.TrimPrefix(cur, root))
		case !st.IsDir():
			return "", fmt.Errorf("entry %q: %q is not a directory", rel, strings.TrimPrefix(cur, root))
		}
	}
	return filepath.Join(root, rel), nil
}

func applyEntry(root string, h *tar.Header, r io.Reader) error {
	rel, err := cleanEntry(h.Name)
	if err != nil {
		return err
	}
	if rel == "" {
		return nil // the root itself
	}
	dir, base := path.Split(rel)
	if base == ".wh..wh..opq" { // opaque directory: drop what lower layers put in it
		d, err := parentIn(root, rel)
		if err != nil {
			return err
		}
		d = filepath.Dir(d)
		ents, err := os.ReadDir(d)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		for _, e := range ents {
			if err := os.RemoveAll(filepath.Join(d, e.Name())); err != nil {
				return err
			}
		}
		return nil
	}
	if victim, ok := strings.CutPrefix(base, ".wh."); ok { // whiteout
		p, err := parentIn(root, dir+victim)
		if err != nil {
			return err
		}
		return os.RemoveAll(p)
	}
	p, err := parentIn(root, rel)
	if err != nil {
		return err
	}
	mode := h.FileInfo().Mode()
	if h.Typeflag != tar.TypeDir {
		// A later layer replaces what an earlier one put here.
		if st, err := os.Lstat(p); err == nil && !(st.IsDir() && h.Typeflag == tar.TypeDir) {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		st, err := os.Lstat(p)
		if err == nil && !st.IsDir() {
			if err := os.Remove(p); err != nil {
				return err
			}
			err = fs.ErrNotExist
		}
		if errors.Is(err, fs.ErrNotExist) {
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
	case tar.TypeReg:
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		return lchown(os.Symlink(h.Linkname, p), p, h)
	case tar.TypeLink:
		target, err := cleanEntry(h.Linkname)
		if err != nil || target == "" {
			return fmt.Errorf("hard link %q -> %q leaves the root", h.Name, h.Linkname)
		}
		tp, err := parentIn(root, target)
		if err != nil {
			return err
		}
		if st, err := os.Lstat(tp); err != nil || !st.Mode().IsRegular() {
			return fmt.Errorf("hard link %q -> %q: target is not a regular file of the image", h.Name, h.Linkname)
		}
		return os.Link(tp, p)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return nil
	default:
		return nil // xattr/global headers and unknown types carry no file
	}
	if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
		return err
	}
	return os.Chmod(p, toSyscallMode(mode))
}

func lchown(err error, p string, h *tar.Header) error {
	if err != nil {
		return err
	}
	return os.Lchown(p, h.Uid, h.Gid)
}

// toSyscallMode keeps permission, setuid, setgid and sticky bits (which
// os.Chmod takes as os.ModeSetuid etc.).
func toSyscallMode(m fs.FileMode) fs.FileMode {
	out := m.Perm()
	for _, b := range []fs.FileMode{fs.ModeSetuid, fs.ModeSetgid, fs.ModeSticky} {
		out |= m & b
	}
	return out
}
