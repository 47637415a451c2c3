package proto

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBatchRoundTrip(t *testing.T) {
	a, err := Encode(NodeDrainType, NodeDrainRequest{NodeID: "n1", Draining: true})
	require.NoError(t, err)
	b, err := Encode(AllocationForceReleaseType, AllocationForceReleaseRequest{AllocationID: "alloc-1", Reason: "x"})
	require.NoError(t, err)
	buf, err := EncodeBatch([][]byte{a, b, a})
	require.NoError(t, err)
	typ, body, err := Decode(buf)
	require.NoError(t, err)
	require.Equal(t, CommandBatchType, typ)
	cmds, err := DecodeBatch(body)
	require.NoError(t, err)
	require.Equal(t, [][]byte{a, b, a}, cmds)

	// Truncated, padded, empty and oversized bodies are refused.
	for _, bad := range [][]byte{body[:len(body)-1], append(append([]byte{}, body...), 0), {}, {0}, {0xff, 0xff, 0xff, 0x7f}} {
		_, err := DecodeBatch(bad)
		require.Error(t, err, "%x", bad)
	}
}

func TestBatchRefusesNestedAndServerOnly(t *testing.T) {
	inner, err := EncodeBatch([][]byte{{byte(RegionUpsertType), '{', '}'}})
	require.NoError(t, err)
	for _, bad := range [][]byte{inner, {byte(PeerUpsertType | IgnoreUnknownTypeFlag)}, {byte(NodeEnrollType)}, {}} {
		_, err := EncodeBatch([][]byte{bad})
		require.Error(t, err)
	}
	_, err = EncodeBatch(nil)
	require.Error(t, err)
}
