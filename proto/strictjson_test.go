package proto

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckJSONKeys(t *testing.T) {
	t.Parallel()
	type inner struct {
		Name string `json:"name"`
	}
	type embedded struct {
		Zone string `json:"zone"`
	}
	type body struct {
		embedded
		Owner  string            `json:"owner"`
		Inner  *inner            `json:"inner,omitempty"`
		List   []inner           `json:"list"`
		Labels map[string]string `json:"labels"`
		Raw    json.RawMessage   `json:"raw"`
		At     time.Time         `json:"at"`
		Skip   string            `json:"-"`
		Plain  int
	}
	for name, tc := range map[string]struct {
		in   string
		want string // "" accepted, else a substring of the error
	}{
		"plain":              {in: `{"owner":"a","inner":{"name":"x"},"list":[{"name":"y"}],"labels":{"A":"1","a":"2"},"raw":{"k":1},"at":"2026-01-01T00:00:00Z","Plain":1,"zone":"z"}`},
		"duplicate top":      {in: `{"owner":"a","owner":"t-admin"}`, want: `duplicate key "owner"`},
		"duplicate nested":   {in: `{"inner":{"name":"a","name":"b"}}`, want: `duplicate key "inner.name"`},
		"duplicate in list":  {in: `{"list":[{"name":"a"},{"name":"b","name":"c"}]}`, want: `duplicate key "list[1].name"`},
		"duplicate map key":  {in: `{"labels":{"a":"1","a":"2"}}`, want: `duplicate key "labels.a"`},
		"duplicate raw":      {in: `{"raw":{"k":1,"k":2}}`, want: `duplicate key "raw.k"`},
		"case top":           {in: `{"Owner":"t-admin"}`, want: `key "Owner" must be spelled "owner"`},
		"case nested":        {in: `{"inner":{"NAME":"x"}}`, want: `key "inner.NAME" must be spelled "name"`},
		"case embedded":      {in: `{"ZONE":"x"}`, want: `"zone"`},
		"case untagged":      {in: `{"plain":1}`, want: `must be spelled "Plain"`},
		"unknown left alone": {in: `{"bogus":1}`},
		"malformed left":     {in: `{"owner":`},
	} {
		err := CheckJSONKeys([]byte(tc.in), &body{})
		if tc.want == "" {
			assert.NoError(t, err, name)
			continue
		}
		require.Error(t, err, name)
		assert.Equal(t, CodeInvalidArgument, CodeOf(err), name)
		assert.Contains(t, err.Error(), tc.want, name)
	}
}

func FuzzCheckJSONKeys(f *testing.F) {
	f.Add([]byte(`{"capacity_shape":"gpu_slice","owner":"a","owner":"b"}`))
	f.Add([]byte(`{"Region":"x","ssh_public_keys":["a"]}`))
	f.Add([]byte(`[{"a":1}]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var req AllocationCreateRequest
		err := CheckJSONKeys(raw, &req)
		if err != nil {
			assert.Equal(t, CodeInvalidArgument, CodeOf(err))
		}
	})
}
