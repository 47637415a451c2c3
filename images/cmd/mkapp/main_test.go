package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gpuaas/gpuaas/images/apps"
)

// The output names the archive's sha256 as the manifest's image and keeps
// the OCI manifest digest apart, saying it is not that.
func TestSummarySaysWhichDigestTheManifestTakes(t *testing.T) {
	arch := strings.Repeat("a", 64)
	oci := "sha256:" + strings.Repeat("7", 64)
	s := summary(apps.Built{Path: "bin/apps/hello.oci.tar", Digest: oci, Ref: apps.Hello.Repository + "@" + oci, ArchiveSHA256: arch, Size: 1234})
	assert.Contains(t, s, `"image":      "`+apps.Hello.Repository+`@sha256:`+arch+`"`)
	assert.Contains(t, s, `"image_size": 1234`)
	assert.Contains(t, s, oci+": not the app manifest's image")
	assert.NotContains(t, s, apps.Hello.Repository+"@"+oci)
}
