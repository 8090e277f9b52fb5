package kvevents

import (
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// readHex reads a testdata fixture: hex byte pairs, '#' starts a comment.
func readHex(t testing.TB, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	for line := range strings.Lines(string(raw)) {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		sb.WriteString(strings.Join(strings.Fields(line), ""))
	}
	b, err := hex.DecodeString(sb.String())
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return b
}

func TestDecodeVLLMFixtures(t *testing.T) {
	cases := []struct {
		file string
		want Batch
		// encodes: Encode(want) gives the fixture's bytes exactly.
		encodes bool
	}{
		{
			file: "array_batch.hex",
			want: Batch{TS: 1.5, Events: []Event{
				{Kind: BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "GPU"},
				{Kind: BlockRemoved, BlockHashes: []uint64{1}, Medium: "GPU"},
				{Kind: AllBlocksCleared},
			}},
			encodes: true,
		},
		{
			file: "array_old.hex",
			want: Batch{TS: 1700000000.25, DPRank: 1, HasDPRank: true, Events: []Event{
				{Kind: BlockStored, BlockHashes: []uint64{0xfffffffffffffffe, 0xffffffffffffffff},
					Parent: 300, HasParent: true, TokenIDs: []uint32{70000, 5}, BlockSize: 1,
					LoRAID: 7, HasLoRA: true, Medium: "GPU"},
			}},
		},
		{
			file: "map_batch.hex",
			want: Batch{TS: 2, DPRank: 0, HasDPRank: true, Events: []Event{
				{Kind: BlockStored, BlockHashes: []uint64{0x0102030405060708}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "CPU"},
				{Kind: BlockRemoved, BlockHashes: []uint64{5}, Medium: "CPU"},
				{Kind: AllBlocksCleared},
			}},
		},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			p := readHex(t, c.file)
			got, err := Decode(p)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if d := cmp.Diff(c.want, got); d != "" {
				t.Errorf("Decode (-want +got):\n%s", d)
			}
			if c.encodes {
				if enc := Encode(c.want); string(enc) != string(p) {
					t.Errorf("Encode = %x\nwant     %x", enc, p)
				}
			}
			// Every batch survives Encode then Decode.
			back, err := Decode(Encode(got))
			if err != nil {
				t.Fatalf("Decode(Encode): %v", err)
			}
			if d := cmp.Diff(got, back); d != "" {
				t.Errorf("round trip (-want +got):\n%s", d)
			}
		})
	}
}

func TestDecodeRejectsMalformed(t *testing.T) {
	good := readHex(t, "array_batch.hex")
	cases := []struct {
		name string
		p    []byte
	}{
		{"empty", nil},
		{"not a container", []byte{0x01}},
		{"truncated", good[:len(good)-3]},
		{"trailing bytes", append(append([]byte{}, good...), 0x00)},
		{"one field", []byte{0x91, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}},
		{"array length beyond the payload", []byte{0x92, 0x00, 0xdd, 0x7f, 0xff, 0xff, 0xff}},
		{"string length beyond the payload", []byte{0x92, 0x00, 0x91, 0x91, 0xdb, 0x7f, 0xff, 0xff, 0xff}},
		{"unknown tag", []byte{0x92, 0x00, 0x91, 0x91, 0xa3, 'F', 'o', 'o'}},
		{"event without tag", []byte{0x92, 0x00, 0x91, 0x90}},
		{"tag not a string", []byte{0x92, 0x00, 0x91, 0x91, 0x05}},
		{"removed without hashes", []byte{0x92, 0x00, 0x91, 0x91, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd'}},
		{"map without ts", []byte{0x81, 0xa6, 'e', 'v', 'e', 'n', 't', 's', 0x90}},
		{"map event not starting with type", []byte{0x92, 0x00, 0x91, 0x81, 0xa2, 't', 's', 0x00}},
		{"hash a string", []byte{0x92, 0x00, 0x91, 0x93, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0x91, 0xa1, 'x', 0xc0}},
		{"deep nesting in an unknown field", append([]byte{0x93, 0x00, 0x90}, append(repeat(0x91, MaxDepth+2), 0x00)...)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode(c.p)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode = %v, want ErrMalformed", err)
			}
		})
	}
}

func TestDecodeStoredTokenCountMustMatchBlocks(t *testing.T) {
	b := Batch{Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{1, 2, 3}, BlockSize: 2}}}
	if _, err := Decode(Encode(b)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Decode = %v, want ErrMalformed", err)
	}
}

func repeat(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

// FuzzDecode feeds arbitrary payloads: Decode must return a batch or an
// ErrMalformed error, never panic, and never hold much more memory than the
// payload (each decoded element costs at least one payload byte).
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"array_batch.hex", "array_old.hex", "map_batch.hex"} {
		f.Add(readHex(f, name))
	}
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := Decode(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		n := 0
		for _, e := range b.Events {
			n += 1 + len(e.BlockHashes) + len(e.TokenIDs)
		}
		if n > len(p) {
			t.Fatalf("decoded %d elements from %d bytes", n, len(p))
		}
		if _, err := Decode(Encode(b)); err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
		// Whatever a batch says, the index takes it twice (stores and
		// removals replayed) within its budget, keyed either way.
		for _, byTokens := range []bool{false, true} {
			x := NewIndex(64)
			x.SetKeyByTokens(byTokens)
			x.Apply("r", b, time.Unix(1, 0))
			x.Apply("r", b, time.Unix(2, 0))
			if st, ok := x.Stats("r"); !ok || st.Blocks > 64 {
				t.Fatalf("keyed by tokens %v: %+v, budget 64", byTokens, st)
			}
		}
	})
}
