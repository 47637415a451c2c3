package proto

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseImageSpec(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][2]string{"base": {"base", ""}, "base:24.04.1": {"base", "24.04.1"}, "h200-host:2026.04": {"h200-host", "2026.04"}} {
		n, v, err := ParseImageSpec(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, [2]string{n, v}, in)
	}
	for _, in := range []string{"", ":1", "base:", "Base", "base:1:2", "../x", "base:V1", strings.Repeat("a", 129)} {
		_, _, err := ParseImageSpec(in)
		assert.Error(t, err, in)
	}
}

func TestImageKinds(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "tgz", ImageMAASTgz.MAASFileType())
	assert.Equal(t, "ddgz", ImageMAASDdgz.MAASFileType())
	assert.Equal(t, "", ImageSliceBase.MAASFileType())
	assert.True(t, ImageSliceCUDA.Slice())
	assert.False(t, ImageMAASTgz.Slice())
	assert.False(t, ImageKind("qcow2").Valid())

	tgz := &Image{Name: "h", Version: "1", Kind: ImageMAASTgz}
	ddgz := &Image{Name: "h", Version: "2", Kind: ImageMAASDdgz}
	slice := &Image{Name: "s", Version: "1", Kind: ImageSliceBase}
	for _, layout := range []string{"", "flat", "lvm", "blank"} {
		assert.NoError(t, tgz.CheckHostImage(layout), layout)
		assert.Error(t, slice.CheckHostImage(layout), layout)
	}
	err := ddgz.CheckHostImage("")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "flat storage layout needs a maas_tgz")
	assert.NoError(t, ddgz.CheckHostImage("blank"))
}

func TestApprovedFor(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)
	ap := func(action ImageState, site, profile string) ImageApproval {
		return ImageApproval{By: "admin", At: at, Action: action, Site: site, Profile: profile}
	}
	for name, tc := range map[string]struct {
		state     ImageState
		approvals []ImageApproval
		site      string
		profiles  []string
		want      bool
		scope     string
	}{
		"global":                {ImageApproved, []ImageApproval{ap(ImageApproved, "", "")}, "", nil, true, "everywhere"},
		"global covers a site":  {ImageApproved, []ImageApproval{ap(ImageApproved, "", "")}, "s1", []string{"slice"}, true, "everywhere"},
		"site only":             {ImageApproved, []ImageApproval{ap(ImageApproved, "s1", "")}, "s1", []string{"slice"}, true, "site s1"},
		"other site":            {ImageApproved, []ImageApproval{ap(ImageApproved, "s1", "")}, "s2", nil, false, "site s1"},
		"no site needs global":  {ImageApproved, []ImageApproval{ap(ImageApproved, "s1", "")}, "", nil, false, "site s1"},
		"profile match":         {ImageApproved, []ImageApproval{ap(ImageApproved, "s1", "slice")}, "s1", []string{"bm", "slice"}, true, "site s1 profile slice"},
		"profile mismatch":      {ImageApproved, []ImageApproval{ap(ImageApproved, "s1", "slice")}, "s1", []string{"bm"}, false, "site s1 profile slice"},
		"revoked voids earlier": {ImageApproved, []ImageApproval{ap(ImageApproved, "", ""), ap(ImageRevoked, "", ""), ap(ImageApproved, "s1", "")}, "s2", nil, false, "site s1"},
		"revoked state":         {ImageRevoked, []ImageApproval{ap(ImageApproved, "", ""), ap(ImageRevoked, "", "")}, "", nil, false, ""},
		"pending":               {ImagePending, nil, "", nil, false, ""},
		"two sites":             {ImageApproved, []ImageApproval{ap(ImageApproved, "s2", ""), ap(ImageApproved, "s1", "")}, "s2", nil, true, "site s1, site s2"},
	} {
		im := &Image{Name: "x", Version: "1", State: tc.state, Approvals: tc.approvals}
		assert.Equal(t, tc.want, im.ApprovedFor(tc.site, tc.profiles...), name)
		if tc.state == ImageApproved {
			assert.Equal(t, tc.scope, im.Scope(), name)
		}
	}
}
