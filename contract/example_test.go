package contract_test

import (
	"fmt"

	"github.com/tether-agent/tether/contract"
)

func ExampleTransportID_String() {
	id := contract.TransportID{Instance: "9f86d081884c7d65", Conn: 3}
	fmt.Println(id)
	fmt.Println(contract.TransportID{})
	// Output:
	// 9f86d081884c7d65/3
	// -
}

func ExampleParseTransportID() {
	id, err := contract.ParseTransportID("9f86d081884c7d65/3")
	fmt.Println(id.Instance, id.Conn, err)

	_, err = contract.ParseTransportID("-")
	fmt.Println(err)
	// Output:
	// 9f86d081884c7d65 3 <nil>
	// transport id "-": invalid argument
}
