package proto

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sync"

	"github.com/hashicorp/go-msgpack/v2/codec"
)

// Raft command bodies (after the type byte) are binary: a codec version
// byte, then the body in that codec. Version 1 is MessagePack
// (hashicorp/go-msgpack, as Nomad and Consul encode their logs) over the
// command structs' own `json` field names, so every command struct —
// including ones added later — encodes with no codec code of its own.
// Bodies written before the binary codec are JSON; a JSON text never
// starts with a control byte, so the first byte tells them apart, and
// DecodeBody reads both. A control byte that is not a known version is
// refused: a newer codec must not be read as an older one.
//
// JSON stays the encoding of the HTTP API (and of audit hashes).
const (
	// CodecMsgpackV1 is the version byte of MessagePack bodies.
	CodecMsgpackV1 byte = 0x01
	// CodecVersion is the version Encode writes.
	CodecVersion = CodecMsgpackV1
)

// msgpackHandle is the one MessagePack configuration of command bodies
// and snapshot records: canonical (map keys sorted, so the same value
// always encodes to the same bytes), the new spec's str/bin types, time
// as the MessagePack timestamp extension (UTC), strings decoded as Go
// strings and generic maps as map[string]any.
var msgpackHandle = func() *codec.MsgpackHandle {
	h := &codec.MsgpackHandle{WriteExt: true}
	h.Canonical = true
	h.RawToString = true
	h.MapType = reflect.TypeOf(map[string]any(nil))
	// A corrupt length must not make the decoder allocate it up front.
	h.MaxInitLen = 1 << 12
	return h
}()

// pooledEncoder is an encoder with its scratch buffer (the codec writes
// from the start of the buffer it is given, so it cannot append in place).
type pooledEncoder struct {
	enc *codec.Encoder
	buf []byte
}

var (
	encPool = sync.Pool{New: func() any {
		e := &pooledEncoder{buf: make([]byte, 0, 1024)}
		e.enc = codec.NewEncoderBytes(&e.buf, msgpackHandle)
		return e
	}}
	decPool = sync.Pool{New: func() any { return codec.NewDecoderBytes(nil, msgpackHandle) }}
)

// MarshalBinary encodes v in the current codec: the version byte, then
// the body. It is the body encoding of Encode and of snapshot records.
func MarshalBinary(v any) ([]byte, error) {
	return AppendBinary(make([]byte, 0, 256), v)
}

// AppendBinary appends v's encoding (version byte and body) to b.
func AppendBinary(b []byte, v any) ([]byte, error) {
	e := encPool.Get().(*pooledEncoder)
	e.buf = e.buf[:0]
	e.enc.ResetBytes(&e.buf)
	if err := e.enc.Encode(v); err != nil {
		encPool.Put(e)
		return nil, fmt.Errorf("msgpack encode %T: %w", v, err)
	}
	b = append(append(b, CodecVersion), e.buf...)
	if cap(e.buf) <= 64<<10 { // do not pin a huge buffer in the pool
		encPool.Put(e)
	}
	return b, nil
}

// DecodeBody decodes a command body (or snapshot record) into v: a
// versioned binary body, or a JSON one written before the binary codec.
// An empty body, an unknown version byte and a body that does not decode
// completely into v are errors.
func DecodeBody(body []byte, v any) error {
	if len(body) == 0 {
		return fmt.Errorf("empty body")
	}
	switch c := body[0]; {
	case c == CodecMsgpackV1:
		dec := decPool.Get().(*codec.Decoder)
		defer decPool.Put(dec)
		dec.ResetBytes(body[1:])
		if err := dec.Decode(v); err != nil {
			return fmt.Errorf("msgpack decode %T: %w", v, err)
		}
		if n := dec.NumBytesRead(); n != len(body)-1 {
			return fmt.Errorf("msgpack decode %T: %d trailing bytes", v, len(body)-1-n)
		}
		return nil
	case c < 0x20 && c != '\t' && c != '\n' && c != '\r':
		return fmt.Errorf("unknown body codec version %d (this build reads %d and legacy JSON)", c, CodecMsgpackV1)
	default:
		return json.Unmarshal(body, v)
	}
}
