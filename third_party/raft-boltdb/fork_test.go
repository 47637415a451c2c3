package raftboltdb

import (
	"bytes"
	"math/rand"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
)

// upstreamEncode is raft-boltdb v2.3.1's encodeMsgPack, verbatim: a new
// handle and a bytes.Buffer per log. The fork must write the same bytes,
// or logs written before and after it would differ on disk.
func upstreamEncode(in interface{}, useNewTimeFormat bool) []byte {
	buf := bytes.NewBuffer(nil)
	hd := codec.MsgpackHandle{
		BasicHandle: codec.BasicHandle{
			TimeNotBuiltin: !useNewTimeFormat,
		},
	}
	enc := codec.NewEncoder(buf, &hd)
	if err := enc.Encode(in); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

func forkTestLogs() []*raft.Log {
	rng := rand.New(rand.NewSource(1))
	blob := func(n int) []byte {
		b := make([]byte, n)
		rng.Read(b)
		return b
	}
	logs := []*raft.Log{
		{},
		{Index: 1, Term: 1, Type: raft.LogNoop},
		{Index: 2, Term: 1, Type: raft.LogCommand, Data: []byte{}},
		{Index: 3, Term: 2, Type: raft.LogConfiguration, Data: blob(40), Extensions: blob(3)},
		{Index: 1 << 40, Term: 1 << 33, Type: raft.LogCommand, Data: blob(1 << 20)},
		{Index: 5, Term: 3, Type: raft.LogCommand, Data: blob(300), AppendedAt: time.Date(2026, 11, 26, 5, 40, 0, 123456789, time.UTC)},
		{Index: 6, Term: 3, Type: raft.LogBarrier, AppendedAt: time.Date(1999, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))},
	}
	for i := 0; i < 200; i++ {
		logs = append(logs, &raft.Log{
			Index: rng.Uint64(), Term: rng.Uint64() >> uint(rng.Intn(64)), Type: raft.LogType(rng.Intn(7)),
			Data: blob(rng.Intn(20000)), Extensions: blob(rng.Intn(3) * rng.Intn(200)),
			AppendedAt: time.Unix(rng.Int63n(1<<35), rng.Int63n(1e9)).In(time.FixedZone("z", (i%24-12)*3600)),
		})
	}
	return logs
}

func TestForkEncodeMatchesUpstream(t *testing.T) {
	for _, newTime := range []bool{false, true} {
		enc := newLogEncoder(newTime)
		for i, l := range forkTestLogs() {
			want := upstreamEncode(l, newTime)
			got, err := enc.encode(l)
			if err != nil {
				t.Fatalf("log %d: %v", i, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("log %d (new time format %v): the fork encodes %d bytes, upstream %d, and they differ", i, newTime, len(got), len(want))
			}
			buf, err := encodeMsgPack(l, newTime)
			if err != nil {
				t.Fatalf("log %d: %v", i, err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Fatalf("log %d: encodeMsgPack with the shared handle differs from upstream", i)
			}
			var back raft.Log
			if err := decodeMsgPack(got, &back); err != nil {
				t.Fatalf("log %d: decode: %v", i, err)
			}
			if back.Index != l.Index || back.Term != l.Term || back.Type != l.Type ||
				!bytes.Equal(back.Data, l.Data) || !bytes.Equal(back.Extensions, l.Extensions) || !back.AppendedAt.Equal(l.AppendedAt) {
				t.Fatalf("log %d (index %d): the decoded log differs from the one encoded", i, l.Index)
			}
		}
	}
}

// The encoded values of one StoreLogs call must not share memory: bbolt
// keeps every Put value until the commit.
func TestForkEncodeValuesAreIndependent(t *testing.T) {
	enc := newLogEncoder(false)
	logs := forkTestLogs()
	vals := make([][]byte, len(logs))
	for i, l := range logs {
		v, err := enc.encode(l)
		if err != nil {
			t.Fatal(err)
		}
		vals[i] = v
	}
	for i, l := range logs {
		if !bytes.Equal(vals[i], upstreamEncode(l, false)) {
			t.Fatalf("log %d was overwritten by a later encode", i)
		}
	}
}

// StoreLogs of a batch reads back the same logs (through the store, after
// the commit) as the upstream encoding would.
func TestForkStoreLogsRoundTrip(t *testing.T) {
	store := testBoltStore(t)
	defer store.Close()
	logs := forkTestLogs()[1:8]
	for i, l := range logs {
		l.Index = uint64(i + 1)
	}
	if err := store.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	for _, l := range logs {
		var got raft.Log
		if err := store.GetLog(l.Index, &got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(upstreamEncode(&got, false), upstreamEncode(l, false)) {
			t.Fatalf("log %d read back differs", l.Index)
		}
	}
}
