package daemon

import (
	"context"
	"strings"

	"github.com/gpuaas/gpuaas/agent/imagecache"
	"github.com/gpuaas/gpuaas/agent/slice"
	"github.com/gpuaas/gpuaas/proto"
)

// imageSource feeds the slice runtime: file:// images (the lab's local
// guest) are verified in place; everything else comes through the image
// cache, downloaded from the mirror or the coordinators, verified, and
// pinned until the provision is over.
type imageSource struct {
	files *slice.FileSource
	cache *imagecache.Cache
}

var _ slice.ImageReleaser = (*imageSource)(nil)

func local(ref proto.ImageRef) bool { return strings.HasPrefix(ref.URL, "file://") }

func (s *imageSource) Fetch(ctx context.Context, ref proto.ImageRef, progress func(done, total int64)) (string, error) {
	if local(ref) || s.cache == nil {
		return s.files.Fetch(ctx, ref, progress)
	}
	return s.cache.Fetch(ctx, ref, progress)
}

func (s *imageSource) ReleaseImage(ref proto.ImageRef) {
	if !local(ref) && s.cache != nil {
		s.cache.Release(ref.Digest)
	}
}
