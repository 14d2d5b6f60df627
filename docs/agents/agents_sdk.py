"""The OpenAI Agents SDK against speedgate (`pip install openai-agents`): the gateway is the
default client, tracing off (it would export to OpenAI), and the run's session named by the
x-session-id header. The standard tier: model="mymodel"."""

from agents import Agent, ModelSettings, Runner, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI

set_default_openai_client(AsyncOpenAI(base_url="http://127.0.0.1:8080/v1",
                                      api_key="sg-your-key"))
set_tracing_disabled(True)

agent = Agent(name="assistant", instructions="You are a helpful assistant.", model="mymodel-fast",
              model_settings=ModelSettings(extra_headers={"x-session-id": "my-task-1"}))
result = Runner.run_sync(agent, "Say hi")
print(result.final_output)
