package agent_test

import (
	"context"
	"fmt"

	"github.com/tether-agent/tether/host/agent"
)

func ExampleEcho() {
	a, err := agent.NewEchoFactory(0).NewAgent(context.Background(), "20250102_030405_abcdef", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	err = a.Run(context.Background(), nil, "  hello brave\tnew world", func(delta string) {
		fmt.Printf("%q\n", delta)
	})
	fmt.Println(err)
	// Output:
	// "  hello "
	// "brave\t"
	// "new "
	// "world"
	// <nil>
}

func ExampleParseCommandLine() {
	argv, err := agent.ParseCommandLine(`my-agent --name 'two words' --say "it's \"here\"" a\ b`)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, w := range argv {
		fmt.Printf("[%s]\n", w)
	}
	// Output:
	// [my-agent]
	// [--name]
	// [two words]
	// [--say]
	// [it's "here"]
	// [a b]
}
