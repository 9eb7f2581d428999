// A shared library without the mllm_register_plugin entry point: loading it must fail clearly.
extern "C" int mllm_not_a_plugin() { return 1; }
