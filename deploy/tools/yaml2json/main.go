// Command yaml2json reads a stream of YAML documents (`---` separated, as `helm template`
// writes them) on stdin and writes them as one JSON array on stdout, empty documents left out.
// It parses as Kubernetes' own clients do (k8s.io/apimachinery's document reader and
// sigs.k8s.io/yaml, strict: a duplicate key is an error), so tests/it/deploy.rs can judge a
// rendered chart without a YAML parser of its own. Built by deploy/tools/build-helm.sh.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

func main() {
	r := utilyaml.NewYAMLReader(bufio.NewReader(os.Stdin))
	docs := []json.RawMessage{}
	for n := 1; ; n++ {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "yaml2json: document %d: %v\n", n, err)
			os.Exit(1)
		}
		j, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			fmt.Fprintf(os.Stderr, "yaml2json: document %d: %v\n", n, err)
			os.Exit(1)
		}
		if t := bytes.TrimSpace(j); len(t) == 0 || bytes.Equal(t, []byte("null")) {
			continue
		}
		docs = append(docs, j)
	}
	out, err := json.Marshal(docs)
	if err != nil {
		fmt.Fprintf(os.Stderr, "yaml2json: %v\n", err)
		os.Exit(1)
	}
	os.Stdout.Write(append(out, '\n'))
}
