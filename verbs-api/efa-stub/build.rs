fn main() {
    roce_cabi::link_cdylib("libefa.map", "libefa.so.1");
}
