package imagecache

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/proto"
)

// BlobGetter downloads coordinator blobs with the node credential
// (*client.Client of package agent/client is one).
type BlobGetter interface {
	GetBlob(ctx context.Context, path string, offset int64) (*http.Response, error)
}

type coordinatorSource struct{ g BlobGetter }

// Coordinators is the source that downloads ref.URL (the image's blob
// path, /v1/images/NAME/VERSION/blob) from the coordinators.
func Coordinators(g BlobGetter) Source { return coordinatorSource{g: g} }

func (s coordinatorSource) String() string { return "coordinators" }

func (s coordinatorSource) Get(ctx context.Context, ref proto.ImageRef, offset int64) (*http.Response, error) {
	p := ref.URL
	if p == "" {
		p = proto.BlobPath(ref.Name, ref.Version)
	}
	return s.g.GetBlob(ctx, p, offset)
}

type mirrorSource struct {
	base   string
	client *http.Client
}

// Mirror is a plain HTTP(S) mirror of the coordinators' blob store: it
// serves the image of digest sha256:HEX at BASE/sha256/HEX (a static copy
// of a coordinator's blobs directory), with Range support for resuming.
func Mirror(base string, client *http.Client) (Source, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("image mirror %q is not an http(s) URL", base)
	}
	if client == nil {
		client = &http.Client{}
	}
	return mirrorSource{base: strings.TrimRight(base, "/"), client: client}, nil
}

func (s mirrorSource) String() string { return "mirror " + s.base }

func (s mirrorSource) Get(ctx context.Context, ref proto.ImageRef, offset int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/sha256/"+proto.DigestHex(ref.Digest), nil)
	if err != nil {
		return nil, err
	}
	if offset > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(offset, 10)+"-")
	}
	return s.client.Do(req)
}

// Sources is the agent's usual source list: the mirror (when mirror is
// not "") tried first, then the coordinators.
func Sources(mirror string, coordinators BlobGetter) ([]Source, error) {
	var out []Source
	if mirror != "" {
		m, err := Mirror(mirror, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if coordinators != nil {
		out = append(out, Coordinators(coordinators))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("image cache: no source (neither a mirror nor coordinators)")
	}
	return out, nil
}
