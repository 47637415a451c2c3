// Copyright (c) HashiCorp, Inc.
// SPDX-License-Identifier: MPL-2.0

package raftboltdb

import (
	"bytes"
	"encoding/binary"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
)

// The msgpack handles, configured once and shared: a handle is safe for
// concurrent use by any number of encoders and decoders once configured
// (go-msgpack's doc). Upstream built a new handle per log, so every
// encode and decode started with an empty type-info cache.
var (
	decodeHandle = &codec.MsgpackHandle{}
	// encodeHandleOldTime encodes time.Time as upstream's default
	// (TimeNotBuiltin); encodeHandleNewTime with the new format.
	encodeHandleOldTime = &codec.MsgpackHandle{BasicHandle: codec.BasicHandle{TimeNotBuiltin: true}}
	encodeHandleNewTime = &codec.MsgpackHandle{BasicHandle: codec.BasicHandle{TimeNotBuiltin: false}}
)

// Decode reverses the encode operation on a byte slice input
func decodeMsgPack(buf []byte, out interface{}) error {
	r := bytes.NewBuffer(buf)
	dec := codec.NewDecoder(r, decodeHandle)
	return dec.Decode(out)
}

// Encode writes an encoded object to a new bytes buffer
func encodeMsgPack(in interface{}, useNewTimeFormat bool) (*bytes.Buffer, error) {
	buf := bytes.NewBuffer(nil)
	enc := codec.NewEncoder(buf, encodeHandle(useNewTimeFormat))
	err := enc.Encode(in)
	return buf, err
}

func encodeHandle(useNewTimeFormat bool) *codec.MsgpackHandle {
	if useNewTimeFormat {
		return encodeHandleNewTime
	}
	return encodeHandleOldTime
}

// logEncodeOverhead bounds the msgpack of a raft.Log beyond its Data and
// Extensions (field names, integers, the bin headers, AppendedAt), so a
// log encodes into one allocation of the right size.
const logEncodeOverhead = 128

// logEncoder encodes the logs of one StoreLogs call with one encoder.
type logEncoder struct {
	enc *codec.Encoder
	out []byte
}

func newLogEncoder(useNewTimeFormat bool) *logEncoder {
	e := &logEncoder{}
	e.enc = codec.NewEncoderBytes(&e.out, encodeHandle(useNewTimeFormat))
	return e
}

// encode returns the msgpack of l (the same bytes as encodeMsgPack) in a
// new slice of its own: bbolt keeps a Put value until the commit.
func (e *logEncoder) encode(l *raft.Log) ([]byte, error) {
	e.out = make([]byte, 0, len(l.Data)+len(l.Extensions)+logEncodeOverhead)
	e.enc.ResetBytes(&e.out)
	if err := e.enc.Encode(l); err != nil {
		return nil, err
	}
	return e.out, nil
}

// Converts bytes to an integer
func bytesToUint64(b []byte) uint64 {
	return binary.BigEndian.Uint64(b)
}

// Converts a uint to a byte slice
func uint64ToBytes(u uint64) []byte {
	buf := make([]byte, 8)
	binary.BigEndian.PutUint64(buf, u)
	return buf
}
