package sched_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
	"github.com/gpuaas/gpuaas/sched/schedtest"
)

// host is a fixture node with its slots.
type host struct {
	node  *proto.Node
	slots []*proto.Slot
}

// sliceHost is an HGX slice host; mods replace slots by index.
func sliceHost(id, region string, mods map[int][]schedtest.SlotOption, opts ...schedtest.NodeOption) host {
	n, slots := schedtest.SliceHost(id, region, opts...)
	for i, o := range mods {
		slots[i] = schedtest.Slot(id, i, o...)
	}
	return host{n, slots}
}

// claimed returns mods that claim the given slot indexes.
func claimed(idx ...int) map[int][]schedtest.SlotOption {
	m := map[int][]schedtest.SlotOption{}
	for _, i := range idx {
		m[i] = []schedtest.SlotOption{schedtest.Claimed("c-" + string(rune('a'+i)))}
	}
	return m
}

// build puts hosts into a fresh State with the given regions.
func build(t testing.TB, hosts ...host) *schedtest.State {
	t.Helper()
	st := schedtest.New()
	for _, h := range hosts {
		require.NoError(t, st.PutNode(h.node, h.slots...))
	}
	return st
}

func sliceSKU(t testing.TB) proto.SKU {
	t.Helper()
	s, ok := proto.FindSKU(proto.DefaultSKUs(), "h200-sxm-slice")
	require.True(t, ok)
	return s
}

func bmSKU(t testing.TB) proto.SKU {
	t.Helper()
	s, ok := proto.FindSKU(proto.DefaultSKUs(), "h200-sxm-baremetal")
	require.True(t, ok)
	return s
}

func sliceReq(t testing.TB, n int, region string) sched.SliceRequest {
	return sched.SliceRequest{SKU: sliceSKU(t), GPUCount: n, Region: region}
}
