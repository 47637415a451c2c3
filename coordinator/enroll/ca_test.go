package enroll

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

func caRec(id string, key bool) proto.CARecord {
	r := proto.CARecord{ID: id, CertPEM: "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n", Subject: "ca " + id}
	if key {
		r.KeyPEM = "-----BEGIN EC PRIVATE KEY-----\nx\n-----END EC PRIVATE KEY-----\n"
	}
	return r
}

// TestCARotationTable: staged -> active -> previous -> retired, one staged
// CA at a time, refusals change nothing, the bundle version follows, the
// table survives a snapshot and a retired CA's key is dropped.
func TestCARotationTable(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	tab := New()
	assert.Empty(t, CABundleVersion(tab.CAs()))
	old, n1, n2 := "00000000000000a1", "00000000000000b2", "00000000000000c3"

	require.Error(t, tab.IntroduceCA(proto.CAIntroduceRequest{At: at, Current: caRec(old, false), New: caRec("nothex", true)}))
	require.Error(t, tab.IntroduceCA(proto.CAIntroduceRequest{At: at, Current: caRec(old, false), New: caRec(n1, false)}), "the new CA needs its key")
	assert.Empty(t, tab.CAs(), "refusals change nothing")

	require.NoError(t, tab.IntroduceCA(proto.CAIntroduceRequest{At: at, By: "admin", Current: caRec(old, true), New: caRec(n1, true)}))
	cas := tab.CAs()
	require.Len(t, cas, 2)
	assert.Equal(t, proto.CAActive, cas[0].State)
	assert.Empty(t, cas[0].KeyPEM, "the current CA's key is not replicated")
	assert.Equal(t, proto.CAStaged, cas[1].State)
	v1 := CABundleVersion(cas)
	assert.NotEmpty(t, v1)

	err := tab.IntroduceCA(proto.CAIntroduceRequest{At: at, New: caRec(n2, true)})
	assert.Equal(t, proto.CodeConflict, proto.CodeOf(err), "one staged CA at a time")
	assert.Equal(t, proto.CodeIllegalTransition, proto.CodeOf(tab.RetireCA(proto.CARetireRequest{At: at, ID: old})), "the active CA is not retired")
	assert.Equal(t, proto.CodeIllegalTransition, proto.CodeOf(tab.ActivateCA(proto.CAActivateRequest{At: at, ID: old})))
	assert.Equal(t, proto.CodeNotFound, proto.CodeOf(tab.ActivateCA(proto.CAActivateRequest{At: at, ID: n2})))
	assert.Equal(t, v1, CABundleVersion(tab.CAs()))

	require.NoError(t, tab.ActivateCA(proto.CAActivateRequest{At: at.Add(time.Minute), ID: n1}))
	cas = tab.CAs()
	assert.Equal(t, proto.CAPrevious, cas[0].State)
	assert.Equal(t, proto.CAActive, cas[1].State)
	v2 := CABundleVersion(cas)
	assert.NotEqual(t, v1, v2)

	b, err := tab.MarshalJSON()
	require.NoError(t, err)
	restored := New()
	require.NoError(t, restored.Restore(b))
	assert.Equal(t, cas, restored.CAs())

	require.NoError(t, tab.RetireCA(proto.CARetireRequest{At: at.Add(2 * time.Minute), ID: old}))
	cas = tab.CAs()
	assert.Equal(t, proto.CARetired, cas[0].State)
	assert.NotEqual(t, v2, CABundleVersion(cas))
	// A second rotation: the retired CA stays listed, the active keeps its key.
	require.NoError(t, tab.IntroduceCA(proto.CAIntroduceRequest{At: at, New: caRec(n2, true)}))
	require.NoError(t, tab.RetireCA(proto.CARetireRequest{At: at, ID: n2}), "a staged CA may be abandoned")
	cas = tab.CAs()
	require.Len(t, cas, 3)
	assert.Empty(t, cas[2].KeyPEM, "a retired CA's key is dropped")
	assert.NotEmpty(t, cas[1].KeyPEM)
}
