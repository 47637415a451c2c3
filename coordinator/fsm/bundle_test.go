package fsm_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

func TestBundlePublish(t *testing.T) {
	t.Parallel()
	h := maasHarness(t)
	b := testBundle("#!/bin/sh\necho hello\n")
	got := h.OK(proto.BundlePublishType, proto.BundlePublishRequest{At: h.At(), Bundle: b}).(*proto.Bundle)
	assert.Equal(t, b.Digest, got.Digest)
	stored, ok := h.Snap().Bundle(b.Digest)
	require.True(t, ok)
	assert.Equal(t, b.Content, stored.Content)

	// The same content again is the stored bundle (no new write).
	again := h.OK(proto.BundlePublishType, proto.BundlePublishRequest{At: h.At(), Bundle: b}).(*proto.Bundle)
	assert.Equal(t, got.ModifyIndex, again.ModifyIndex)

	for name, mut := range map[string]func(*proto.Bundle){
		"digest of other content": func(x *proto.Bundle) { x.Digest = proto.BundleDigest([]byte("other")) },
		"wrong size":              func(x *proto.Bundle) { x.Size++ },
		"unknown kind":            func(x *proto.Bundle) { x.Kind = "firmware" },
		"not a script or gzip": func(x *proto.Bundle) {
			x.Content = []byte("plain")
			x.Digest = proto.BundleDigest(x.Content)
			x.Size = 5
		},
		"empty": func(x *proto.Bundle) { x.Content = nil; x.Size = 0 },
	} {
		bad := testBundle("#!/bin/sh\necho bad\n")
		mut(&bad)
		h.Refuse(proto.BundlePublishType, proto.BundlePublishRequest{At: h.At(), Bundle: bad}, proto.CodeInvalidArgument)
		_, ok := h.Snap().Bundle(bad.Digest)
		assert.False(t, ok, "%s: nothing stored", name)
	}
	// The same bytes under another kind are refused.
	other := b
	other.Kind = proto.BundlePostDeployValidation
	h.Refuse(proto.BundlePublishType, proto.BundlePublishRequest{At: h.At(), Bundle: other}, proto.CodeAlreadyExists)
}
