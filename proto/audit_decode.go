package proto

import (
	"encoding/binary"
	"math"
	"time"
)

// Every replica decodes every attached audit append, and the generic
// MessagePack decoder does it by reflection. DecodeAuditAppend reads the
// form Encode writes (a canonical map of the JSON field names) by hand,
// and leaves anything else — a legacy JSON body, a value of another
// MessagePack type, an unknown or repeated key, an empty array or state,
// trailing bytes — to DecodeBody, so it decodes exactly what DecodeBody
// decodes (FuzzDecodeAuditAppend compares the two).

// DecodeAuditAppend decodes the body of an audit append (as DecodeBody).
func DecodeAuditAppend(body []byte) (*AuditAppendRequest, error) {
	req := new(AuditAppendRequest)
	if decodeAuditAppendFast(body, req) {
		return req, nil
	}
	*req = AuditAppendRequest{}
	if err := DecodeBody(body, req); err != nil {
		return nil, err
	}
	return req, nil
}

// decodeAuditAppendFast decodes body into req when it is in the form
// Encode writes; false: take the generic way (req is then garbage).
func decodeAuditAppendFast(body []byte, req *AuditAppendRequest) bool {
	if len(body) == 0 || body[0] != CodecMsgpackV1 {
		return false
	}
	r := mpReader{b: body, i: 1}
	n, ok := r.mapLen()
	if !ok {
		return false
	}
	var seen uint8
	for range n {
		k, ok := r.key()
		if !ok {
			return false
		}
		var bit uint8
		switch string(k) {
		case "at":
			bit, ok = 1, r.timestamp(&req.At)
		case "attached":
			bit, ok = 2, r.boolean(&req.Attached)
		case "record":
			bit, ok = 4, r.record(&req.Record)
		default:
			return false
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
	}
	return r.i == len(r.b)
}

func (r *mpReader) record(rec *AuditRecord) bool {
	n, ok := r.mapLen()
	if !ok {
		return false
	}
	var seen uint32
	for range n {
		k, ok := r.key()
		if !ok {
			return false
		}
		var bit uint32
		switch string(k) {
		case "seq":
			bit, ok = 1<<0, r.unsigned(&rec.Seq)
		case "time":
			bit, ok = 1<<1, r.timestamp(&rec.Time)
		case "index":
			bit, ok = 1<<2, r.unsigned(&rec.Index)
		case "actor":
			bit, ok = 1<<3, r.str(&rec.Actor)
		case "role":
			bit, ok = 1<<4, r.str(&rec.Role)
		case "token_id":
			bit, ok = 1<<5, r.str(&rec.TokenID)
		case "remote":
			bit, ok = 1<<6, r.str(&rec.Remote)
		case "request_id":
			bit, ok = 1<<7, r.str(&rec.RequestID)
		case "method":
			bit, ok = 1<<8, r.str(&rec.Method)
		case "route":
			bit, ok = 1<<9, r.str(&rec.Route)
		case "path":
			bit, ok = 1<<10, r.str(&rec.Path)
		case "object_kind":
			bit, ok = 1<<11, r.str(&rec.ObjectKind)
		case "object_id":
			bit, ok = 1<<12, r.str(&rec.ObjectID)
		case "slots":
			bit, ok = 1<<13, r.strs(&rec.Slots)
		case "reason":
			bit, ok = 1<<14, r.str(&rec.Reason)
		case "before":
			bit, ok = 1<<15, r.raw((*[]byte)(&rec.Before))
		case "after":
			bit, ok = 1<<16, r.raw((*[]byte)(&rec.After))
		case "status":
			bit, ok = 1<<17, r.signed(&rec.Status)
		case "error":
			bit, ok = 1<<18, r.str(&rec.Error)
		case "pruned":
			bit, ok = 1<<19, r.boolean(&rec.Pruned)
		case "prev_hash":
			bit, ok = 1<<20, r.str(&rec.PrevHash)
		case "hash":
			bit, ok = 1<<21, r.str(&rec.Hash)
		default:
			return false
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
	}
	return true
}

// mpReader reads the MessagePack values the fast path accepts; every
// method returns false on anything else (or a short input).
type mpReader struct {
	b []byte
	i int
}

func (r *mpReader) readByte() (byte, bool) {
	if r.i >= len(r.b) {
		return 0, false
	}
	c := r.b[r.i]
	r.i++
	return c, true
}

func (r *mpReader) next(n int) ([]byte, bool) {
	if n < 0 || len(r.b)-r.i < n {
		return nil, false
	}
	s := r.b[r.i : r.i+n]
	r.i += n
	return s, true
}

// length reads a big-endian length of size bytes (1, 2 or 4).
func (r *mpReader) length(size int) (int, bool) {
	s, ok := r.next(size)
	if !ok {
		return 0, false
	}
	switch size {
	case 1:
		return int(s[0]), true
	case 2:
		return int(binary.BigEndian.Uint16(s)), true
	default:
		return int(binary.BigEndian.Uint32(s)), true
	}
}

func (r *mpReader) mapLen() (int, bool) {
	c, ok := r.readByte()
	switch {
	case !ok:
		return 0, false
	case c >= 0x80 && c <= 0x8f:
		return int(c & 0x0f), true
	case c == 0xde:
		return r.length(2)
	case c == 0xdf:
		return r.length(4)
	}
	return 0, false
}

// strBytes reads a str value (fixstr, str8/16/32) without copying it.
func (r *mpReader) strBytes() ([]byte, bool) {
	c, ok := r.readByte()
	if !ok {
		return nil, false
	}
	var n int
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = int(c & 0x1f)
	case c == 0xd9:
		n, ok = r.length(1)
	case c == 0xda:
		n, ok = r.length(2)
	case c == 0xdb:
		n, ok = r.length(4)
	default:
		return nil, false
	}
	if !ok {
		return nil, false
	}
	return r.next(n)
}

func (r *mpReader) key() ([]byte, bool) { return r.strBytes() }

func (r *mpReader) str(dst *string) bool {
	s, ok := r.strBytes()
	if ok {
		*dst = string(s)
	}
	return ok
}

// strs reads a non-empty array of strs.
func (r *mpReader) strs(dst *[]string) bool {
	c, ok := r.readByte()
	if !ok {
		return false
	}
	var n int
	switch {
	case c > 0x90 && c <= 0x9f:
		n = int(c & 0x0f)
	case c == 0xdc:
		n, ok = r.length(2)
	case c == 0xdd:
		n, ok = r.length(4)
	default:
		return false
	}
	if !ok || n == 0 || n > len(r.b)-r.i {
		return false
	}
	out := make([]string, n)
	for i := range out {
		if !r.str(&out[i]) {
			return false
		}
	}
	*dst = out
	return true
}

// raw reads a non-empty str or bin into a new byte slice.
func (r *mpReader) raw(dst *[]byte) bool {
	c, ok := r.readByte()
	if !ok {
		return false
	}
	var n int
	switch {
	case c >= 0xa1 && c <= 0xbf:
		n = int(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		n, ok = r.length(1)
	case c == 0xda || c == 0xc5:
		n, ok = r.length(2)
	case c == 0xdb || c == 0xc6:
		n, ok = r.length(4)
	default:
		return false
	}
	if !ok || n == 0 {
		return false
	}
	s, ok := r.next(n)
	if ok {
		*dst = append([]byte(nil), s...)
	}
	return ok
}

func (r *mpReader) boolean(dst *bool) bool {
	c, ok := r.readByte()
	switch {
	case ok && c == 0xc2:
		*dst = false
	case ok && c == 0xc3:
		*dst = true
	default:
		return false
	}
	return true
}

// unsigned reads a non-negative integer (fixint or uint8..64).
func (r *mpReader) unsigned(dst *uint64) bool {
	c, ok := r.readByte()
	if !ok {
		return false
	}
	var v uint64
	switch {
	case c <= 0x7f:
		v = uint64(c)
	case c >= 0xcc && c <= 0xcf:
		s, ok := r.next(1 << (c - 0xcc))
		if !ok {
			return false
		}
		v = bigEndian(s)
	default:
		return false
	}
	*dst = v
	return true
}

// signed reads an integer that fits an int.
func (r *mpReader) signed(dst *int) bool {
	c, ok := r.readByte()
	if !ok {
		return false
	}
	var v int64
	switch {
	case c <= 0x7f:
		v = int64(c)
	case c >= 0xe0:
		v = int64(int8(c))
	case c >= 0xcc && c <= 0xcf:
		s, ok := r.next(1 << (c - 0xcc))
		if !ok {
			return false
		}
		u := bigEndian(s)
		if u > math.MaxInt64 {
			return false
		}
		v = int64(u)
	case c >= 0xd0 && c <= 0xd3:
		s, ok := r.next(1 << (c - 0xd0))
		if !ok {
			return false
		}
		switch len(s) {
		case 1:
			v = int64(int8(s[0]))
		case 2:
			v = int64(int16(binary.BigEndian.Uint16(s)))
		case 4:
			v = int64(int32(binary.BigEndian.Uint32(s)))
		default:
			v = int64(binary.BigEndian.Uint64(s))
		}
	default:
		return false
	}
	if v < math.MinInt || v > math.MaxInt {
		return false
	}
	*dst = int(v)
	return true
}

// timestamp reads a timestamp extension (4, 8 or 12 bytes) as the generic
// decoder builds it, or nil (the zero time).
func (r *mpReader) timestamp(dst *time.Time) bool {
	c, ok := r.readByte()
	if !ok {
		return false
	}
	var s []byte
	switch c {
	case 0xc0:
		*dst = time.Time{}
		return true
	case 0xd6, 0xd7:
		if t, ok := r.readByte(); !ok || t != 0xff {
			return false
		}
		n := 4
		if c == 0xd7 {
			n = 8
		}
		s, ok = r.next(n)
	case 0xc7:
		if n, ok := r.readByte(); !ok || n != 12 {
			return false
		}
		if t, ok := r.readByte(); !ok || t != 0xff {
			return false
		}
		s, ok = r.next(12)
	default:
		return false
	}
	if !ok {
		return false
	}
	switch len(s) {
	case 4:
		*dst = time.Unix(int64(binary.BigEndian.Uint32(s)), 0).UTC()
	case 8:
		tv := binary.BigEndian.Uint64(s)
		*dst = time.Unix(int64(tv&0x00000003ffffffff), int64(tv>>34)).UTC()
	default:
		*dst = time.Unix(int64(binary.BigEndian.Uint64(s[4:])), int64(binary.BigEndian.Uint32(s[:4]))).UTC()
	}
	return true
}

func bigEndian(s []byte) uint64 {
	var v uint64
	for _, c := range s {
		v = v<<8 | uint64(c)
	}
	return v
}
