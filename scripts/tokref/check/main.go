// Command check compares internal/hftok with reference ids and chat
// renderings written by gen_local.mjs, for a model whose tokenizer files
// cannot be committed (see scripts/tokref/README.md). It exits 1 on any
// difference.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/llmlb/llmlb/internal/hftok"
)

func main() {
	dir := flag.String("dir", "", "folder with tokenizer.json (and tokenizer_config.json)")
	refFile := flag.String("ref", "", "reference written by gen_local.mjs")
	flag.Parse()
	if err := run(*dir, *refFile); err != nil {
		fmt.Fprintln(os.Stderr, "check:", err)
		os.Exit(1)
	}
}

func run(dir, refFile string) error {
	tk, err := hftok.LoadFile(filepath.Join(dir, "tokenizer.json"), hftok.Options{})
	if err != nil {
		return err
	}
	b, err := os.ReadFile(refFile)
	if err != nil {
		return err
	}
	var ref struct {
		Cases []struct {
			Text       string   `json:"text"`
			IDs        []uint32 `json:"ids"`
			IDsSpecial []uint32 `json:"ids_special"`
		} `json:"cases"`
		Chats []struct {
			Messages []hftok.Message `json:"messages"`
			Rendered string          `json:"rendered"`
			IDs      []uint32        `json:"ids"`
		} `json:"chats"`
	}
	if err := json.Unmarshal(b, &ref); err != nil {
		return err
	}
	bad := 0
	for i, c := range ref.Cases {
		got, err := tk.Encode(c.Text)
		if err != nil || !slices.Equal(got, c.IDs) {
			bad++
			fmt.Printf("case %d %.60q: ids differ (err %v)\n", i, c.Text, err)
			continue
		}
		if c.IDsSpecial == nil {
			continue
		}
		if got, err := tk.EncodeWithSpecialTokens(c.Text); err != nil || !slices.Equal(got, c.IDsSpecial) {
			bad++
			fmt.Printf("case %d %.60q: ids with special tokens differ (err %v)\n", i, c.Text, err)
		}
	}
	if len(ref.Chats) > 0 {
		ct, err := hftok.LoadChatTemplateFile(filepath.Join(dir, "tokenizer_config.json"))
		if err != nil {
			return err
		}
		for i, c := range ref.Chats {
			r, err := ct.Render(c.Messages)
			if err != nil || r != c.Rendered {
				bad++
				fmt.Printf("chat %d: rendering differs (err %v)\n got %q\nwant %q\n", i, err, r, c.Rendered)
				continue
			}
			if got, err := tk.Encode(r); err != nil || !slices.Equal(got, c.IDs) {
				bad++
				fmt.Printf("chat %d: ids differ (err %v)\n", i, err)
			}
		}
	}
	n := len(ref.Cases) + len(ref.Chats)
	fmt.Printf("%d of %d strings and chats equal\n", n-bad, n)
	if bad > 0 {
		return fmt.Errorf("%d differ", bad)
	}
	return nil
}
