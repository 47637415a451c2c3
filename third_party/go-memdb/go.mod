module github.com/hashicorp/go-memdb

go 1.13

require github.com/hashicorp/go-immutable-radix v1.3.1

replace github.com/hashicorp/go-immutable-radix => ../go-immutable-radix
