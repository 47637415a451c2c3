package proto

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
)

// CheckJSONKeys walks raw (one JSON value) beside the Go type of v and
// refuses what encoding/json silently accepts: a key that appears twice
// in one object (the last one would win) and a key that names a struct
// field only case-insensitively ("Owner" for "owner"). The error is
// CodeInvalidArgument and names the key with its path. Keys of maps and
// of values decoded by their own UnmarshalJSON (json.RawMessage,
// time.Time) are checked for duplicates only. Malformed JSON is left to
// the decoder, which describes it better: call this after decoding.
func CheckJSONKeys(raw []byte, v any) error {
	t := reflect.TypeOf(v)
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	err := checkJSONValue(dec, t, "")
	if _, ok := err.(*Error); ok {
		return err
	}
	return nil
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// jsonShape normalises t: pointers are followed, and a type with its own
// UnmarshalJSON is opaque (nil).
func jsonShape(t reflect.Type) reflect.Type {
	for t != nil {
		if t.Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerType) {
			return nil
		}
		if t.Kind() != reflect.Pointer {
			return t
		}
		t = t.Elem()
	}
	return nil
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func checkJSONValue(dec *json.Decoder, t reflect.Type, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	t = jsonShape(t)
	switch d {
	case '{':
		var fields *jsonFields
		var elem reflect.Type
		if t != nil {
			switch t.Kind() {
			case reflect.Struct:
				fields = fieldsOf(t)
			case reflect.Map:
				elem = t.Elem()
			}
		}
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := kt.(string)
			if seen[key] {
				return Errorf(CodeInvalidArgument, "duplicate key %q", joinPath(path, key))
			}
			seen[key] = true
			ft := elem
			if fields != nil {
				if f, ok := fields.exact[key]; ok {
					ft = f
				} else if name, ok := fields.folded[strings.ToLower(key)]; ok {
					return Errorf(CodeInvalidArgument, "key %q must be spelled %q (field names are case-sensitive)", joinPath(path, key), name)
				}
			}
			if err := checkJSONValue(dec, ft, joinPath(path, key)); err != nil {
				return err
			}
		}
		_, err := dec.Token()
		return err
	case '[':
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := checkJSONValue(dec, elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err := dec.Token()
		return err
	}
	return nil
}

// jsonFields are a struct's JSON field names (embedded structs promoted).
type jsonFields struct {
	exact  map[string]reflect.Type
	folded map[string]string // lower-cased name -> name
}

var fieldCache sync.Map // reflect.Type -> *jsonFields

func fieldsOf(t reflect.Type) *jsonFields {
	if f, ok := fieldCache.Load(t); ok {
		return f.(*jsonFields)
	}
	f := &jsonFields{exact: map[string]reflect.Type{}, folded: map[string]string{}}
	collectFields(t, f, 0)
	fieldCache.Store(t, f)
	return f
}

func collectFields(t reflect.Type, f *jsonFields, depth int) {
	if depth > 8 {
		return
	}
	for i := range t.NumField() {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if sf.Anonymous && name == "" {
			et := sf.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				collectFields(et, f, depth+1)
				continue
			}
		}
		if !sf.IsExported() {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		if _, dup := f.exact[name]; dup {
			continue
		}
		f.exact[name] = sf.Type
		f.folded[strings.ToLower(name)] = name
	}
}
