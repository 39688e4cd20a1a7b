fn main() {
    roce_cabi::link_cdylib("libibverbs.map", "libibverbs.so.1");
}
